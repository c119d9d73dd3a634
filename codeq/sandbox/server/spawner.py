"""The spawner (trusted side). Under gVisor a fork costs ~5 ms whatever the process, and a finished child's teardown as
much again. A process of its own, the spawner, forks every run's child ahead of time and
kills, reaps and wipes finished runs, so that work overlaps with the server's handling of the
current run instead of sitting in front of it. The spawner is forked before the first request
is read, so neither it nor any child it forks ever holds a run's secret."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import signal
import socket
import traceback

from .child import child_main
from .jail import PR_SET_CHILD_SUBREAPER, fresh_uid, libc
from .protocol import send_message
from .strays import kill_everything, reap

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
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
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
