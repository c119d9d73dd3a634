"""The untrusted side: a forked child that closes every inherited descriptor, enters the
jail, sets rlimits, drops to its run's uid and only then reads and runs the program."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import struct
import sys
import time

from .jail import PR_SET_NO_NEW_PRIVS, libc
from .protocol import read_frame

# Imported here so programs that use them work inside the jail without the files being read
# again (the jail exposes the stdlib read-only, but preloading also makes each run faster).
PRELOADED = [
    "abc",
    "array",
    "bisect",
    "builtins",
    "collections",
    "collections.abc",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "io",
    "itertools",
    "keyword",
    "math",
    "numbers",
    "operator",
    "queue",
    "random",
    "re",
    "statistics",
    "string",
    "struct",
    "sys",
    "textwrap",
    "threading",
    "time",
    "types",
    "typing",
    "unicodedata",
    "json",
    "cmath",
    "contextlib",
    "graphlib",
    "pprint",
    "reprlib",
    "weakref",
]
for _name in PRELOADED:
    with contextlib.suppress(ImportError):
        __import__(_name)

import builtins  # noqa: E402

ERROR_CHARS = 2000


def describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not break the harness
        text = type(exc).__name__
    return text[:ERROR_CHARS]


def child_main(request_fd: int, result_fd: int, out_fd: int, err_fd: int, setup: dict) -> None:
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    keep = sorted({0, 1, 2, request_fd, result_fd})
    close_all_except(keep)
    run_dir = setup["run_dir"]
    if setup["jail"]:
        os.chroot(setup["jail_dir"])
        run_dir = run_dir[len(setup["jail_dir"]) :]
    os.chdir(run_dir)
    limits = setup["limits"]
    memory = limits["memory_mb"] * 1024 * 1024
    set_limit(resource.RLIMIT_AS, memory)
    set_limit(resource.RLIMIT_DATA, memory)
    set_limit(resource.RLIMIT_CPU, limits["cpu_time_s"])
    set_limit(resource.RLIMIT_FSIZE, limits["max_file_bytes"])
    set_limit(resource.RLIMIT_NOFILE, 64)
    set_limit(resource.RLIMIT_CORE, 0)
    set_limit(resource.RLIMIT_NPROC, limits["max_processes"])
    uid = setup["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.environ.clear()
    os.environ.update({"HOME": "/", "TMPDIR": os.getcwd(), "PATH": "/usr/bin:/bin"})
    request = json.loads(read_frame(request_fd))
    os.close(request_fd)
    try:
        run_harness(request, result_fd)
    finally:
        flush_output()


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        # The program may have replaced or closed them.
        with contextlib.suppress(BaseException):
            stream.flush()  # type: ignore[union-attr]


def close_all_except(keep: list[int]) -> None:
    # Listing the open descriptors is far cheaper than closing 64k numbers one syscall each
    # (gVisor has no close_range).
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = []
    if open_fds:
        for fd in open_fds:
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return
    low = 0
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def set_limit(which: int, value: int) -> None:
    try:
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(which)
        if hard == resource.RLIM_INFINITY or value < hard:
            resource.setrlimit(which, (min(value, hard) if hard >= 0 else value, hard))


def run_harness(request: dict, result_fd: int) -> None:
    send = make_sender(result_fd)
    runner_ns: dict = {"__name__": "codeq_runner", "__builtins__": builtins}
    try:
        exec(compile(request["runner"], "<runner>", "exec"), runner_ns)
        run_call = runner_ns["run_call"]
    except BaseException as exc:  # noqa: BLE001
        send({"load": "runner_error", "error": describe(exc)})
        return
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(request["prelude"], "<prelude>", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001
        send({"load": "prelude_error", "error": describe(exc)})
        return
    try:
        code = compile(request["program"], "<program>", "exec")
    except (SyntaxError, ValueError) as exc:
        send({"load": "syntax_error", "error": describe(exc)})
        return
    try:
        exec(code, namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit, MemoryError ... are load errors
        send({"load": "load_error", "error": describe(exc)})
        return
    send({"load": "ok"})
    for index, call in enumerate(request["calls"]):
        started = time.perf_counter()
        try:
            value = run_call(namespace, call)
            encoded = json.dumps(value)
            message = {"i": index, "ok": True, "value": encoded, "error": None}
        except BaseException as exc:  # noqa: BLE001
            message = {"i": index, "ok": False, "value": None, "error": describe(exc)}
        message["seconds"] = time.perf_counter() - started
        send(message)


def make_sender(result_fd: int):
    # Bound now so a program that patches json/os later cannot change how results are framed.
    dumps, write, pack, flush = json.dumps, os.write, struct.pack, flush_output

    def send(message: dict) -> None:
        flush()  # output before a result is in the pipe when the server reads that result
        body = dumps(message).encode()
        data = memoryview(pack(">I", len(body)) + body)
        while data:
            data = data[write(result_fd, data) :]

    return send
