"""Ending a finished run: every process of its uid (host) or every stray process
(gVisor, where kill is not atomic against a fork in flight) is killed, and exits are reaped."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable


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
