"""The sandbox's public records (see docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = (
    "ok",
    "syntax_error",
    "load_error",
    "timeout",
    "memory",
    "killed",
    "output_limit",
    "sandbox_error",
)


@dataclass(frozen=True)
class ExecRequest:
    program: str  # untrusted source
    runner: str  # trusted source defining run_call(namespace: dict, call: dict) -> Any
    calls: list[dict] = field(default_factory=list)  # given to run_call one by one, in order
    prelude: str = ""  # run in the program's namespace before it (imports, TreeNode...)
    call_timeout_s: float | None = None  # per-call limit; the run is still capped by the wall


@dataclass
class CallResult:
    ok: bool  # run_call returned a JSON-serializable value without raising
    value: Any  # JSON-decoded return value when ok
    error: str | None  # "ExceptionType: message" when not ok
    seconds: float


@dataclass
class ExecResult:
    status: str  # one of STATUSES
    backend: str  # gvisor | subprocess
    calls: list[CallResult | None]  # one per call; None = not reached
    stdout: str  # truncated diagnostics only, never parsed for results
    stderr: str
    seconds: float

    @property
    def all_ok(self) -> bool:
        """Every call ran and returned; says nothing about correctness (compared outside)."""
        return self.status == "ok" and all(call is not None and call.ok for call in self.calls)
