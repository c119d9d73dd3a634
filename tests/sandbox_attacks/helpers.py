"""Shared helpers for the sandbox tests: backends to test, a tiny trusted runner, host checks."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from codeq.config import SandboxConfig
from codeq.sandbox import ExecRequest, ExecResult, Sandbox
from codeq.sandbox.bundle import BUNDLE_NAME
from codeq.sandbox.server.spawner import READY_CHILDREN

RUNNER = """
def run_call(namespace, call):
    return namespace[call["function"]](*call["args"])
"""

HAS_RUNSC = shutil.which("runsc") is not None
BACKENDS = [
    pytest.param(
        "gvisor", marks=pytest.mark.skipif(not HAS_RUNSC, reason="runsc (gVisor) not installed")
    ),
    "subprocess",
]


def small_config(backend: str, **overrides: object) -> SandboxConfig:
    values: dict[str, object] = {
        "backend": backend,
        "workers": 1,
        "memory_mb": 256,
        "wall_timeout_s": 4.0,
        "cpu_time_s": 4,
        "max_output_bytes": 64 * 1024,
        "max_file_bytes": 1024 * 1024,
        "max_processes": 16,
    }
    values.update(overrides)
    return SandboxConfig(**values)  # type: ignore[arg-type]


def request(program: str, *args_per_call: list, timeout: float | None = 1.5) -> ExecRequest:
    calls = [{"function": "solve", "args": list(args)} for args in args_per_call]
    return ExecRequest(program=program, runner=RUNNER, calls=calls, call_timeout_s=timeout)


def passes(result: ExecResult, expected: list) -> bool:
    """The comparison a scorer makes outside the sandbox: every call ran and matched."""
    if result.status != "ok" or len(result.calls) != len(expected):
        return False
    return all(
        call is not None and call.ok and call.value == want
        for call, want in zip(result.calls, expected, strict=True)
    )


def assert_still_healthy(sandbox: Sandbox) -> None:
    result = sandbox.run(request("def solve(a, b):\n    return a * b\n", [6, 7]))
    assert result.status == "ok", result
    assert result.calls[0] is not None and result.calls[0].value == 42


def descendants(root: int | None = None) -> dict[int, str]:
    """pid -> command line of every live (non-zombie) process below `root` (default: us)."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            if fields[0] in (b"Z", b"X"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                commands[int(name)] = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            parents[int(name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    root = os.getpid() if root is None else root
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        current = frontier.pop()
        for pid, parent in parents.items():
            if parent == current and pid not in found:
                found[pid] = commands[pid]
                frontier.append(pid)
    return found


def still_running(processes: dict[int, str]) -> dict[int, str]:
    alive = {}
    for pid, command in processes.items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                now = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if now == command and state not in (b"Z", b"X"):
            alive[pid] = command
    return alive


def host_processes() -> dict[int, str]:
    """descendants() without gVisor's stub processes: gVisor backs each sandboxed address space
    with a host stub (empty command line) that it pools and reuses; those are the sandbox's own,
    checked from inside instead."""
    return {pid: command for pid, command in descendants().items() if command}


def runsc_role(command: str) -> str | None:
    """Which of one `runsc do`'s own processes this command line is, or None: the `runsc do`
    the worker started, its re-exec of itself (/proc/self/exe, runsc from 2024 on), its gofer
    and its sandbox."""
    argv = command.split()
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name in ("runsc-gofer", "runsc-sandbox"):
        return name.removeprefix("runsc-")
    if "do" in argv[1:]:
        if name == "runsc":
            return "do"
        if argv[0] == "/proc/self/exe":
            return "re-exec"
    return None


def unaccounted(sandbox: Sandbox, processes: dict[int, str]) -> dict[int, str]:
    """The processes in `processes` that the sandbox's workers do not account for.

    gVisor: each worker is one `runsc do`, so every process must be one of its roles and no role
    may occur more often than there are workers (a process the program left on the host, or a
    runsc of a replaced worker still alive, is reported). Host subprocess backend: per worker the
    server, its spawner and the children ready for the next runs, all with the server's command
    line; a process with any other command line is reported, and so are server-line processes
    beyond that count (a child the program forked without exec). Counting alone let a stray hide
    in the slot of a ready child the pool had not refilled yet."""
    if sandbox.backend == "gvisor":
        stray: dict[int, str] = {}
        by_role: dict[str, dict[int, str]] = {}
        for pid, command in processes.items():
            role = runsc_role(command)
            if role is None:
                stray[pid] = command
            else:
                by_role.setdefault(role, {})[pid] = command
        for members in by_role.values():
            if len(members) > sandbox.workers:
                stray.update(members)
        return stray
    servers = {pid: command for pid, command in processes.items() if is_sandbox_server(command)}
    stray = {pid: command for pid, command in processes.items() if pid not in servers}
    if len(servers) > sandbox.workers * (2 + READY_CHILDREN):
        stray.update(servers)
    return stray


def is_sandbox_server(command: str) -> bool:
    """The host backend's server (and its forks: the spawner, the ready children) runs the
    bundle the worker wrote to its scratch directory."""
    argv = command.split()
    return len(argv) > 4 and argv[1:4] == ["-S", "-I", "-B"] and argv[4].endswith(f"/{BUNDLE_NAME}")


def leftover_host_processes(sandbox: Sandbox, window_s: float = 10.0) -> dict[int, str]:
    """Host processes below us that the sandbox does not account for and that stay for the whole
    window. A child the spawner is forking for its pool, or one it is still reaping, shows up
    only for a moment, so each snapshot is judged on its own and the first clean one wins."""
    deadline = time.monotonic() + window_s
    left = unaccounted(sandbox, host_processes())
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = unaccounted(sandbox, host_processes())
    return left
