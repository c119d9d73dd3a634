"""The trusted fork server that runs inside each warm sandbox (gVisor or the restricted host
subprocess). Standard library only: it runs as `python3 -S -I server.py CONFIG_JSON`.

Protocol on stdin/stdout, every frame a 4-byte big-endian length then the body:
  server -> host  hello: JSON {"hello": {...capabilities}}
  host -> server  request: JSON {"program", "prelude", "runner", "calls", "call_timeout_s",
                  "wall_timeout_s"}, then a second frame with the run's 32-byte secret
  server -> host  reply: JSON result followed by a 32-byte HMAC-SHA256 of that JSON keyed
                  with the request's secret.

Children are forked ahead of time by the spawner, a process of the server's own that is forked
before the first request and so never sees a run's secret. A child closes every inherited
descriptor but its pipes, chroots into a jail holding only the Python standard library, sets
rlimits, drops to an unprivileged uid, and only then receives the program. The server enforces
the wall and per-call limits and reports the child's raw results; the spawner then kills every
process of that uid and wipes the run directory before the next run starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import hmac
import json
import os
import random
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable

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

MAX_FRAME = 256 * 1024 * 1024
ERROR_CHARS = 2000
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


# ---------------------------------------------------------------- framing


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


# ---------------------------------------------------------------- set-up (server, once)


def try_unshare_network_and_mounts() -> dict:
    """Host subprocess backend: a private network and mount namespace where the kernel lets us.
    Under gVisor the sandbox already has no network; unsharing there is harmless."""
    caps = {"netns": False, "mountns": False}
    if _libc.unshare(CLONE_NEWNET) == 0:
        caps["netns"] = True
    if _libc.unshare(CLONE_NEWNS) == 0:
        caps["mountns"] = _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0
    return caps


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None):
    encoded = [None if part is None else part.encode() for part in (source, target, fstype, data)]
    if _libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def stdlib_dirs() -> list[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    found = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib")}
    found.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
    for lib in ("/lib", "/lib64", "/usr/lib", "/usr/lib64"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            found.add(lib)
    # A directory inside another one is already visible through the outer bind mount.
    return [d for d in sorted(found) if not any(d.startswith(o + "/") for o in found)]


def build_jail(jail: str, tmpfs_bytes: int) -> bool:
    """A tmpfs root with the stdlib and system libraries bind-mounted read-only: the program
    sees no host files (datasets, expected outputs, the harness's own source)."""
    try:
        os.makedirs(jail, exist_ok=True)
        mount("tmpfs", jail, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=755")
        for directory in stdlib_dirs():
            target = jail + directory
            os.makedirs(target, exist_ok=True)
            mount(directory, target, None, MS_BIND, None)
            # Read-only where the kernel allows the remount (gVisor refuses; the uid drop covers).
            with contextlib.suppress(OSError):
                mount(None, target, None, MS_BIND | MS_RDONLY | MS_REMOUNT, None)
        os.makedirs(jail + "/runs", mode=0o711, exist_ok=True)
        return True
    except OSError:
        return False


def fresh_uid() -> int:
    # A random uid far above normal accounts, new for every run: its processes are that run's
    # alone, so a uid-wide kill and RLIMIT_NPROC never touch anything else, and a straggler of
    # one run could not reach the next run's files.
    return random.SystemRandom().randrange(3_000_000, 2_000_000_000)


# ---------------------------------------------------------------- child (untrusted side)


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
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
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


# ---------------------------------------------------------------- spawner (trusted side)
#
# Under gVisor a fork costs ~5 ms whatever the process, and a finished child's teardown as
# much again. A process of its own, the spawner, forks every run's child ahead of time and
# kills, reaps and wipes finished runs, so that work overlaps with the server's handling of the
# current run instead of sitting in front of it. The spawner is forked before the first request
# is read, so neither it nor any child it forks ever holds a run's secret.

READY_CHILDREN = 2  # children kept forked and set up, waiting for a request


class Child:
    """A child forked in the spawner, waiting for its request; the spawner keeps none of its
    pipes (their other ends go to the server)."""

    def __init__(self, setup: dict) -> None:
        request_r, self.request_w = os.pipe()
        self.result_r, result_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.uid = fresh_uid() if setup["uid_drop"] else None
        self.run_dir = prepare_run_dir(setup, self.uid)
        setup = {**setup, "uid": self.uid, "run_dir": self.run_dir}
        gc.freeze()  # the child's collector then leaves the inherited objects' pages unshared
        pid = os.fork()
        if pid == 0:
            try:
                child_main(request_r, result_w, out_w, err_w, setup)
            except BaseException:  # noqa: BLE001
                try:
                    traceback.print_exc()
                finally:
                    os._exit(70)
            os._exit(0)
        self.pid = pid
        for fd in (request_r, result_w, out_w, err_w):
            os.close(fd)

    def server_fds(self) -> list[int]:
        return [self.request_w, self.result_r, self.out_r, self.err_r]


def prepare_run_dir(setup: dict, uid: int | None) -> str:
    base = setup["jail_dir"] + "/runs" if setup["jail"] else setup["scratch"]
    setup["counter"] += 1
    run_dir = os.path.join(base, f"run-{setup['counter']}")
    os.makedirs(run_dir, mode=0o700)
    if uid is not None:
        os.chown(run_dir, uid, uid)
    return run_dir


def kill_everything(pid: int, uid: int | None, in_gvisor: bool, keep_uids: set[int]) -> None:
    """Kill every process of a finished run. Inside gVisor every process that is neither root's
    (the server, the spawner) nor a ready child's (`keep_uids`) is a straggler and goes too."""
    if in_gvisor and uid is not None:
        end_strays_in_gvisor(keep_uids)
        return
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    if uid is not None:
        kill_uid(uid)


KILL_DEADLINE_S = 10.0
STOPPED = (b"T", b"t")


class RunNotEnded(Exception):
    """Processes of a finished run could not be killed: the spawner exits, the server with it,
    and the host restarts the whole worker rather than run anything beside them."""


def kill_uid(uid: int) -> None:
    """Kill every process running as `uid`, including ones that left the process group:
    first kill(-1) as that uid (on Linux atomic over the task list), then, from here, every
    process still running as it, until none is left."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)  # never signals the caller itself
        except OSError:
            # setresuid can fail for a uid at its RLIMIT_NPROC (a fork bomb's): the loop below
            # is the backstop.
            pass
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + KILL_DEADLINE_S
    while live := live_processes(lambda owner: owner == uid):
        if time.monotonic() > deadline:
            raise RunNotEnded(f"processes {sorted(live)} of uid {uid} survived SIGKILL")
        for survivor in live:
            with contextlib.suppress(OSError):
                os.kill(survivor, signal.SIGKILL)
        time.sleep(0.0005)


def end_strays_in_gvisor(keep_uids: set[int]) -> None:
    """gVisor's kill is not atomic against a fork in flight: a child that a dying parent was
    still forking can outlive a process-group or uid-wide SIGKILL (a fork bomb under load left
    its whole brood running). So strays are first stopped, since a stopped process cannot fork,
    and only killed once two scans in a row find every one of them stopped."""
    deadline = time.monotonic() + KILL_DEADLINE_S
    stopped_before: set[int] | None = None
    while strays := live_processes(lambda owner: owner != 0 and owner not in keep_uids):
        if time.monotonic() > deadline:
            raise RunNotEnded(f"stray processes {sorted(strays)} survived SIGKILL")
        running = [pid for pid, state in strays.items() if state not in STOPPED]
        if running:
            signal_all(running, signal.SIGSTOP)
            stopped_before = None
        elif stopped_before == set(strays):
            signal_all(list(strays), signal.SIGKILL)
        else:
            stopped_before = set(strays)
        time.sleep(0.0005)


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def live_processes(owned_by: Callable[[int], bool]) -> dict[int, bytes]:
    """pid -> state letter of every process not yet dead (no zombie) whose owner passes."""
    live = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if not owned_by(os.stat(f"/proc/{name}").st_uid):
                continue
            with open(f"/proc/{name}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            live[int(name)] = state
    return live


def reap() -> list[tuple[int, int]]:
    """(pid, raw wait status) of every child that has exited, orphans of runs included."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


class Spawner:
    """The spawner's loop: 'spawn' forks a ready child and hands its pipes to the server;
    'clean' kills every process of a finished run, waits for them (and for the child's exit
    status when asked) and wipes its directory. Exit statuses of run children go to the server
    as they happen, so it learns at once when a program stops early."""

    def __init__(self, sock: socket.socket, setup: dict) -> None:
        self.sock = sock
        self.setup = setup
        self.children: dict[int, Child] = {}
        self.unreaped: set[int] = set()
        self.in_gvisor = bool(setup["limits"]["in_gvisor"])

    def loop(self) -> None:
        # Processes a run leaves behind are reparented here, to be killed with their uid and
        # reaped, instead of piling up as zombies under the server.
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        wakeup_r, wakeup_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        while True:
            ready, _, _ = select.select([self.sock.fileno(), wakeup_r], [], [])
            if wakeup_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wakeup_r, 512):
                        pass
                self.report_exits(reap())
            if self.sock.fileno() in ready:
                messages = self.receive_all()
                if messages is None:
                    break
                # The server waits for cleans before its next run; spawns refill the pool.
                for message in sorted(messages, key=lambda m: m["op"] != "clean"):
                    self.handle(message)
        # The server is gone: end what is left without reporting to it.
        for child in list(self.children.values()):
            del self.children[child.pid]
            end_run(child, self.in_gvisor, self.ready_uids(), wait_for_exit=True)
        reap()

    def receive_all(self) -> list[dict] | None:
        messages: list[dict] = []
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    body = self.sock.recv(1 << 16)
                except BlockingIOError:
                    return messages
                if not body:
                    return None
                messages.append(json.loads(body))
        finally:
            self.sock.setblocking(True)

    def handle(self, message: dict) -> None:
        if message["op"] == "spawn":
            child = Child(self.setup)
            self.children[child.pid] = child
            self.unreaped.add(child.pid)
            reply = {"op": "ready", "pid": child.pid, "uid": child.uid, "run_dir": child.run_dir}
            send_message(self.sock, reply, child.server_fds())
            for fd in child.server_fds():
                os.close(fd)
        elif message["op"] == "clean":
            self.clean(message)

    def clean(self, message: dict) -> None:
        child = self.children.pop(message["pid"], None)
        if child is not None:
            wait = bool(message.get("wait"))
            exits = end_run(child, self.in_gvisor, self.ready_uids(), wait)
            self.report_exits(exits)
        self.report_exits(reap())
        send_message(self.sock, {"op": "cleaned", "pid": message["pid"]})

    def ready_uids(self) -> set[int]:
        return {child.uid for child in self.children.values() if child.uid is not None}

    def report_exits(self, exits: list[tuple[int, int]]) -> None:
        for pid, status in exits:
            if pid in self.unreaped:  # a run's child; orphans it left are reaped silently
                self.unreaped.discard(pid)
                send_message(self.sock, {"op": "exit", "pid": pid, "status": status})


def end_run(
    child: Child, in_gvisor: bool, keep_uids: set[int], wait_for_exit: bool
) -> list[tuple[int, int]]:
    """Kill every process of the run and wipe its directory; with `wait_for_exit`, the
    child's (pid, exit status) once it is gone."""
    kill_everything(child.pid, child.uid, in_gvisor, keep_uids)
    exits = exit_of(child.pid) if wait_for_exit else []
    shutil.rmtree(child.run_dir, ignore_errors=True)
    return exits


def exit_of(pid: int) -> list[tuple[int, int]]:
    try:
        done, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return []
    return [(done, status)] if done else []


def start_spawner(setup: dict) -> tuple[socket.socket, int]:
    """Fork the spawner; it closes the server's host pipes so only the server talks to the host."""
    server_end, spawner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            server_end.close()
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            Spawner(spawner_end, setup).loop()
        finally:
            os._exit(0)
    spawner_end.close()
    return server_end, pid


# ---------------------------------------------------------------- server loop (trusted side)


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


def start_run(request: dict, child: RunChild, limits: dict, link: SpawnerLink) -> Collector:
    """Hand the request to a ready child; its limits count from here."""
    collector = Collector(child, request, limits, link)
    write_frame(child.request_w, json.dumps({k: request[k] for k in CHILD_KEYS}).encode())
    os.close(child.request_w)
    return collector


def finish_run(collector: Collector, link: SpawnerLink) -> dict:
    """Wait for the program's results within its limits and report them raw. A program that
    stopped early is given a moment to exit so its exit status (e.g. SIGXCPU) can be reported."""
    child = collector.child
    collector.collect()
    exit_status = collector.exit_status
    if exit_status is None and not collector.complete:
        if collector.status is None and not collector.garbled:
            exit_status = link.wait_exit(child.pid, 0.1)
        clean_up(child, link, wait_for_exit=True)
        link.wait_cleaned(child.pid)
        if exit_status is None:
            exit_status = link.exit_status(child.pid)
    return {
        "status": collector.status,
        "garbled": collector.garbled,
        "messages": collector.messages,
        "exit": exit_status,
        "stdout": bytes(collector.output[child.out_r]).decode("utf-8", "replace"),
        "stderr": bytes(collector.output[child.err_r]).decode("utf-8", "replace"),
        "seconds": time.monotonic() - collector.started,
    }


def clean_up(child: RunChild, link: SpawnerLink, wait_for_exit: bool = False) -> None:
    """Close the run's pipes and have the spawner kill every process of the run and wipe its
    directory (idempotent). The next run starts only once that is done (`link.forget`)."""
    if child.cleaned:
        return
    child.cleaned = True
    for fd in (child.result_r, child.out_r, child.err_r):
        os.close(fd)
    link.clean(child.pid, wait_for_exit)


CHILD_KEYS = ("program", "prelude", "runner", "calls")


def serve(config: dict) -> None:
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Under gVisor the server is init: orphans that escape the spawner's subreaping end up
    # here, and an ignored SIGCHLD has the kernel reap them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    is_root = os.geteuid() == 0
    caps = try_unshare_network_and_mounts() if is_root else {"netns": False, "mountns": False}
    tmpfs_bytes = max(64 << 20, 4 * config["max_file_bytes"])
    jail_dir = os.path.join(config["scratch"], "jail")
    jail = (
        is_root and (caps["mountns"] or config["in_gvisor"]) and build_jail(jail_dir, tmpfs_bytes)
    )
    setup = {"jail": jail, "jail_dir": jail_dir, "uid_drop": is_root, "limits": config}
    setup.update(scratch=config["scratch"], counter=0)
    link = SpawnerLink(*start_spawner(setup))
    link.spawn(READY_CHILDREN)
    stdin, stdout = 0, os.dup(1)
    os.dup2(os.open("/dev/null", os.O_WRONLY), 1)  # stray prints can never reach the host
    hello = {"jail": jail, "uid_drop": is_root, **caps, "pid": os.getpid()}
    write_frame(stdout, json.dumps({"hello": hello}).encode())
    try:
        serve_requests(stdin, stdout, config, link)
    finally:
        link.close()


def serve_requests(stdin: int, stdout: int, limits: dict, link: SpawnerLink) -> None:
    previous: RunChild | None = None
    while True:
        try:
            request = json.loads(read_frame(stdin))
        except EOFError:
            return
        if previous is not None:
            link.forget(previous.pid)  # nothing of the last run is alive when this one starts
        child = link.take_child()
        link.spawn()  # refill the pool while this program runs
        collector = start_run(request, child, limits, link)
        reply = json.dumps(finish_run(collector, link)).encode()
        try:
            # The run's secret comes in its own frame, read only now: no child, and not the
            # spawner, ever holds the secret that signs a run's results.
            secret = read_frame(stdin)
        except EOFError:
            return
        write_frame(stdout, reply + hmac.new(secret, reply, hashlib.sha256).digest())
        del secret
        clean_up(child, link)  # the spawner cleans while the host reads the reply
        previous = child


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
