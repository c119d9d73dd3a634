"""Shared helpers for the sandbox tests: backends to test, a tiny trusted runner, host checks."""

from __future__ import annotations

import os
import shutil

import pytest

from codeq.config import SandboxConfig
from codeq.sandbox import ExecRequest, ExecResult, Sandbox

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
