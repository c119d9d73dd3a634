"""Framing between host and server (length-prefixed frames) and the server's
messages to and from the spawner (one datagram each, file descriptors attached)."""

from __future__ import annotations

import json
import os
import socket
import struct

MAX_FRAME = 256 * 1024 * 1024


def read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int) -> bytes:
    (size,) = struct.unpack(">I", read_exact(fd, 4))
    if size > MAX_FRAME:
        raise ValueError("frame too large")
    return read_exact(fd, size)


def write_frame(fd: int, body: bytes) -> None:
    write_all(fd, struct.pack(">I", len(body)) + body)


def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])
