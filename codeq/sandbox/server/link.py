"""The server's end of the spawner socket: ready children, their exit statuses, clean acks."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import time
from collections import deque

from .protocol import send_message


class SpawnerGone(Exception):
    """The spawner died: the server exits too, and the host restarts the whole worker."""


class RunChild:
    """The server's view of a ready child: its pid, uid, run directory and pipes."""

    def __init__(self, message: dict, fds: list[int]) -> None:
        self.pid: int = message["pid"]
        self.uid: int | None = message["uid"]
        self.run_dir: str = message["run_dir"]
        self.request_w, self.result_r, self.out_r, self.err_r = fds
        self.cleaned = False


class SpawnerLink:
    """The server's end of the spawner socket: ready children, exit statuses, clean acks."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.ready: deque[RunChild] = deque()
        self.watching: set[int] = set()  # children handed to the server and not yet cleaned
        self.exits: dict[int, int] = {}
        self.cleaned: set[int] = set()

    def spawn(self, count: int = 1) -> None:
        for _ in range(count):
            send_message(self.sock, {"op": "spawn"})

    def clean(self, pid: int, wait_for_exit: bool) -> None:
        send_message(self.sock, {"op": "clean", "pid": pid, "wait": wait_for_exit})

    def pump(self, timeout: float | None) -> None:
        """Take in every message the spawner has sent, waiting up to `timeout` for the first."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        while ready:
            body, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
            if not body:
                raise SpawnerGone("the spawner exited")
            self.dispatch(json.loads(body), fds)
            ready, _, _ = select.select([self.sock], [], [], 0)

    def dispatch(self, message: dict, fds: list[int]) -> None:
        op, pid = message["op"], message["pid"]
        if op == "ready":
            self.ready.append(RunChild(message, fds))
            self.watching.add(pid)
        elif op == "exit" and pid in self.watching:
            self.exits[pid] = message["status"]
        elif op == "cleaned":
            self.cleaned.add(pid)

    def take_child(self) -> RunChild:
        while not self.ready:
            self.pump(None)
        return self.ready.popleft()

    def exit_status(self, pid: int) -> int | None:
        return self.exits.get(pid)

    def wait_exit(self, pid: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.pump(remaining)
        return self.exits[pid]

    def wait_cleaned(self, pid: int) -> None:
        while pid not in self.cleaned:
            self.pump(None)

    def forget(self, pid: int) -> None:
        """The run is over and cleaned: drop what is kept about it."""
        self.wait_cleaned(pid)
        self.cleaned.discard(pid)
        self.watching.discard(pid)
        self.exits.pop(pid, None)

    def close(self) -> None:
        """Closing the socket makes the spawner kill every child it has and exit."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
