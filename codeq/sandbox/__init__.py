"""Isolated execution of untrusted programs (gVisor by default; see docs/architecture.md)."""

from codeq.sandbox.pool import Sandbox, resolve_backend
from codeq.sandbox.records import STATUSES, CallResult, ExecRequest, ExecResult

__all__ = [
    "STATUSES",
    "CallResult",
    "ExecRequest",
    "ExecResult",
    "Sandbox",
    "resolve_backend",
]
