"""Reads a running child's result messages and output until it finishes or breaks a limit."""

from __future__ import annotations

import json
import os
import select
import struct
import time

from .link import RunChild, SpawnerLink


class Collector:
    """Reads the child's result messages and output until it finishes or breaks a limit."""

    def __init__(self, child: RunChild, request: dict, limits: dict, link: SpawnerLink) -> None:
        self.child = child
        self.limits = limits
        self.messages: list[dict] = []
        self.buffer = b""
        self.output = {child.out_r: bytearray(), child.err_r: bytearray()}
        self.output_total = 0
        self.status: str | None = None
        self.wall = min(float(request.get("wall_timeout_s") or 1e9), limits["wall_timeout_s"])
        per_call = request.get("call_timeout_s")
        self.call_timeout = float(per_call) if per_call else None
        self.started = time.monotonic()
        self.last_message = self.started
        self.garbled: str | None = None
        self.exit_status: int | None = None
        self.calls = len(request["calls"])
        self.complete = False
        self.link = link

    def deadline(self) -> float:
        wall_deadline = self.started + self.wall
        if self.call_timeout is None:
            return wall_deadline
        # Loading the program counts as one call: the limit restarts at every result message.
        return min(wall_deadline, self.last_message + self.call_timeout)

    def collect(self) -> None:
        open_fds = [self.child.result_r, self.child.out_r, self.child.err_r]
        while open_fds:
            remaining = self.deadline() - time.monotonic()
            if remaining <= 0:
                self.status = "timeout"
                return
            link_fd = self.link.sock.fileno()
            ready, _, _ = select.select([*open_fds, link_fd], [], [], remaining)
            if link_fd in ready:
                ready.remove(link_fd)
                self.link.pump(0)
                if self.child_exited():
                    # Processes it left behind may hold the pipes open: take what is written
                    # so far and stop; they are killed next.
                    self.read_available(open_fds)
                    return
            for fd in ready:
                if not self.read_once(fd, open_fds):
                    return

    def read_once(self, fd: int, open_fds: list[int]) -> bool:
        """Read one chunk from `fd`; False when a limit or a broken protocol ends the run."""
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            open_fds.remove(fd)
        elif fd == self.child.result_r:
            self.take_results(chunk)
            if self.complete:
                # Every result is in: the verdict cannot change, so the reply need not wait
                # for the program to exit (it is killed right after the reply).
                self.read_available(open_fds)
                return False
            return not self.garbled
        elif not self.take_output(fd, chunk):
            self.status = "output_limit"
            return False
        return True

    def read_available(self, open_fds: list[int]) -> None:
        while open_fds:
            ready, _, _ = select.select(open_fds, [], [], 0)
            if not ready:
                return
            for fd in ready:
                if not self.read_once(fd, open_fds):
                    return

    def child_exited(self) -> bool:
        self.exit_status = self.link.exit_status(self.child.pid)
        return self.exit_status is not None

    def take_output(self, fd: int, chunk: bytes) -> bool:
        cap = self.limits["max_output_bytes"]
        keep = max(0, cap - self.output_total)
        self.output[fd] += chunk[:keep]
        self.output_total += len(chunk)
        return self.output_total <= cap

    def take_results(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > self.limits["max_result_bytes"]:
            self.garbled = "results exceed the size cap"
            return
        while len(self.buffer) >= 4:
            (size,) = struct.unpack(">I", self.buffer[:4])
            if len(self.buffer) < 4 + size:
                return
            body, self.buffer = self.buffer[4 : 4 + size], self.buffer[4 + size :]
            self.accept(body)
            self.last_message = time.monotonic()

    def accept(self, body: bytes) -> None:
        try:
            message = json.loads(body)
        except ValueError:
            self.garbled = "undecodable result message"
            return
        if not isinstance(message, dict):
            self.garbled = "result message is not an object"
            return
        expected_index = len(self.messages) - 1
        if not self.messages:
            if message.get("load") not in (
                "ok",
                "syntax_error",
                "load_error",
                "runner_error",
                "prelude_error",
            ):
                self.garbled = "first result message is not a load report"
                return
        elif message.get("i") != expected_index or not isinstance(message.get("ok"), bool):
            self.garbled = "result messages out of order"
            return
        self.messages.append(message)
        load_ok = self.messages[0].get("load") == "ok"
        self.complete = not load_ok or len(self.messages) == 1 + self.calls
