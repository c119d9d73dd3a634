"""Test support shared by the store, jobs and round tests: a real S3 endpoint (moto's threaded
server on 127.0.0.1) and a fault-injecting HTTP proxy in front of it (5xx answers, stalls)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

BUCKET = "codeq-test"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class Fault:
    kind: str  # "status" | "stall"
    status: int = 503
    seconds: float = 0.0


# What a store that knows nothing of S3's flexible checksums (GCS's XML API with HMAC keys)
# refuses: checksum headers and the aws-chunked bodies that carry a checksum trailer.
CHECKSUM_HEADERS = ("x-amz-checksum-", "x-amz-sdk-checksum-algorithm", "x-amz-trailer")


def checksum_headers(headers: dict[str, str]) -> list[str]:
    """The flexible-checksum parts of a request: checksum headers, a trailer, aws-chunked."""
    found = [
        name.lower()
        for name in headers
        if name.lower().startswith(CHECKSUM_HEADERS) and name.lower() != "x-amz-checksum-mode"
    ]
    if "aws-chunked" in headers.get("Content-Encoding", "").lower():
        found.append("content-encoding: aws-chunked")
    return sorted(found)


class FaultProxy:
    """Forwards HTTP to `upstream`; the next queued faults replace real answers. With
    `reject_checksums` it answers requests carrying flexible checksums as such a store does
    (400 InvalidArgument) and records them in `checksum_requests`; `checksum_mode` counts
    requests that ask for response checksums (x-amz-checksum-mode)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.requests = 0
        self.injected = 0
        self.reject_checksums = False
        self.checksum_requests: list[str] = []
        self.checksum_mode = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    raw = b""
                    while True:
                        size_line = self.rfile.readline()
                        raw += size_line
                        size = int(size_line.split(b";")[0].strip(), 16)
                        chunk = self.rfile.read(size + 2)
                        raw += chunk
                        if size == 0:
                            while chunk not in (b"\r\n", b""):
                                chunk = self.rfile.readline()
                                raw += chunk
                            return raw
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _reject_checksums(self) -> bool:
                with proxy.lock:
                    if "x-amz-checksum-mode" in {k.lower() for k in self.headers}:
                        proxy.checksum_mode += 1
                    found = checksum_headers(dict(self.headers.items()))
                    if not (proxy.reject_checksums and found):
                        return False
                    proxy.checksum_requests.append(f"{self.command} {', '.join(found)}")
                message = b"<Error><Code>InvalidArgument</Code><Message>Invalid argument.</Message></Error>"
                self.send_response(400)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(message)))
                self.end_headers()
                self.wfile.write(message)
                return True

            def _handle(self) -> None:
                body = self._body()
                if self._reject_checksums():
                    return
                fault = proxy.next_fault()
                if fault is not None and fault.kind == "stall":
                    time.sleep(fault.seconds)
                    self.close_connection = True
                    return
                if fault is not None:
                    message = (
                        b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
                    )
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(message)
                    return
                connection = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in {"transfer-encoding", "connection", "content-length"}:
                        self.send_header(key, value)
                length = response.getheader("Content-Length")
                if self.command == "HEAD":
                    self.send_header("Content-Length", length or "0")
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def next_fault(self) -> Fault | None:
        with self.lock:
            self.requests += 1
            if self.faults:
                self.injected += 1
                return self.faults.pop(0)
            return None

    def fail_next(self, count: int, status: int = 503) -> None:
        with self.lock:
            self.faults.extend(Fault("status", status=status) for _ in range(count))

    def stall_next(self, count: int, seconds: float) -> None:
        with self.lock:
            self.faults.extend(Fault("stall", seconds=seconds) for _ in range(count))

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class S3Endpoint:
    url: str  # moto itself
    proxy: FaultProxy

    def client(self):  # a plain client for assertions (no fault proxy)
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session", name="s3_endpoint")
def s3_endpoint_fixture() -> Iterator[S3Endpoint]:
    """moto's S3 server on 127.0.0.1 with a fault proxy in front; the bucket exists."""
    from moto.server import ThreadedMotoServer

    mp = pytest.MonkeyPatch()
    for key, value in S3_ENV.items():
        mp.setenv(key, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = S3Endpoint(f"http://127.0.0.1:{port}", FaultProxy("127.0.0.1", port).start())
    endpoint.client().create_bucket(Bucket=BUCKET)
    yield endpoint
    endpoint.proxy.stop()
    server.stop()
    mp.undo()
