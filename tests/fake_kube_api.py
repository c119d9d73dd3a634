"""A small HTTP server answering the Kubernetes API calls of the chart's scripts (the Job
watcher, the exit handler that releases a workflow's Jobs), for their tests: the bearer token,
JSON replies and merge-patch as the API server does them. Each test's handler subclass keeps
the Jobs it serves and the calls it got."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "test-token"


class KubeApiHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._reply(401, {"kind": "Status", "code": 401})
            return False
        return True

    def _merge_patch_body(self) -> dict[str, Any]:
        assert self.headers["Content-Type"] == "application/merge-patch+json"
        body: dict[str, Any] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        return body


def merge_patch(target: dict[str, Any], body: dict[str, Any]) -> None:
    """A JSON merge patch of a Job's metadata and spec (one level of nested maps)."""
    for section in ("metadata", "spec"):
        for key, value in body.get(section, {}).items():
            if isinstance(value, dict):
                target[section].setdefault(key, {}).update(value)
            else:
                target[section][key] = value


@contextmanager
def serving(handler: type[KubeApiHandler]) -> Iterator[str]:
    """The handler on a loopback port, in a thread; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
