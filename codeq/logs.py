"""The one logging setup of every entry point (the `codeq` CLI and `python -m jobs.<stage>`),
and the one place a failure becomes its `error:` line, so a Job's log reads like the CLI's.

Stages report progress with `log(message)` (an INFO record of the `codeq` logger); libraries
that log through the standard library (boto3, transformers, TRL) reach the same handler."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

from codeq.errors import EXIT_INTERNAL, CodeQError

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_HANDLER_NAME = "codeq"
_logger = logging.getLogger("codeq")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record is emitted (a test's capture, a
    redirected stream), not to the stream that was current when logging was set up."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def setup_logging(verbose: bool = False) -> None:
    """One handler on the root logger (stderr, LOG_FORMAT), INFO or DEBUG; idempotent."""
    root = logging.getLogger()
    if not any(handler.get_name() == _HANDLER_NAME for handler in root.handlers):
        handler = _StderrHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.captureWarnings(True)
    route_library_logs()


def route_library_logs() -> None:
    """transformers (and TRL, which logs through it) install their own stderr handler and stop
    propagation; once imported, send their records to the root handler instead."""
    if "transformers" not in sys.modules:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()


def log(message: str) -> None:
    """A progress or status line of a stage or job."""
    _logger.info(message)


def report_error(exc: BaseException, *, traceback: bool) -> int:
    """Print one `error:` line and a `hint:` for a failed command or job; return its exit code
    (codeq/errors.py). An unexpected exception is a bug: its traceback is logged when
    `traceback` is true (a Job, or the CLI with -v)."""
    if isinstance(exc, CodeQError):
        print_error(exc.message, exc.hint)
        return exc.exit_code
    if traceback:
        _logger.error("unexpected error", exc_info=exc)
    print_error(
        f"unexpected {type(exc).__name__}: {exc}",
        "this is a bug in codeq; "
        + ("its traceback is above" if traceback else "rerun with -v for the traceback"),
    )
    return EXIT_INTERNAL


def print_error(message: str, hint: str | None = None) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    if hint:
        print(f"hint: {hint}", file=sys.stderr, flush=True)


def exit_at_once(code: int) -> None:
    """Flush the logs and standard streams, then leave with `code` without the interpreter's
    finalization: for a process whose work and clean-up are done but whose teardown a native
    library can still turn into another exit (a pending SIGINT, a C++ thread's abort)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
