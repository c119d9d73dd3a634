"""What every job does: load the config (CODEQ_CONFIG_FILE + CODEQ_* env), log it, open the
store, run its stage, and exit with the documented code (codeq/errors.py, docs/jobs.md)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from codeq.errors import EXIT_OK, ConfigError
from codeq.logs import log, report_error, setup_logging
from codeq.shards import shard_from_env

SCRATCH_ENV = "CODEQ_SCRATCH_DIR"
ROUND_ENV = "CODEQ_STORE__ROUND"
FORCE_ENV = "CODEQ_FORCE"
NEXT_ROUND = "next"
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143: what a shell reports for a process ended by SIGTERM


class StageTerminated(BaseException):
    """Raised in the main thread when the job gets SIGTERM (preemption, node drain, the Job
    suspended or deleted). A BaseException, so library code catching Exception cannot swallow
    it: every `finally` and context manager on the way out runs (sandbox workers stopped, the
    S3 multipart uploads aborted) and the stage's completion marker,
    written last on success, is never written."""


# The signal once SIGTERM has arrived. The handler raises wherever the main thread is; raised
# inside a lock's release (a thread pool's submit), the unwinding can replace StageTerminated
# with that code's own error ("release unlocked lock"), which is then a consequence of the stop.
_terminated_by: list[int] = []


def _raise_terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
    _terminated_by.append(signum)
    raise StageTerminated(signum)


def was_terminated() -> bool:
    """SIGTERM arrived in this process (whatever exception it turned into)."""
    return bool(_terminated_by)


def install_sigterm_handler() -> None:
    """Turn SIGTERM into StageTerminated. Needed even when python is PID 1 of its container:
    the kernel drops signals to a namespace's init that has no handler for them."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def force_from_env() -> bool:
    """CODEQ_FORCE: recompute the stage, replacing an output made under another fingerprint
    (the workflow's `force` parameter)."""
    raw = os.environ.get(FORCE_ENV, "").strip().lower()
    if raw in {"", "0", "false", "no"}:
        return False
    if raw in {"1", "true", "yes"}:
        return True
    raise ConfigError(
        f"{FORCE_ENV}={raw!r} is neither true nor false",
        hint="set it to 1/true to replace a stage's earlier output, or 0/false (the default)",
    )


SHARDED_STAGES = ("collect", "evaluate")  # Indexed Jobs: the shard from the Job's environment


def stage_arguments(stage: str) -> dict[str, Any]:
    if stage in SHARDED_STAGES:
        index, count = shard_from_env()
        return {"shard_index": index, "shard_count": count}
    return {}


def run_stage(stage: str) -> int:
    """Run one stage as a job and return its exit code."""
    from codeq.config import dump_config, load_config
    from codeq.pipeline.stages import STAGE_FUNCTIONS, StageContext
    from codeq.store import open_store

    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix=f"codeq-{stage}-", dir=os.environ.get(SCRATCH_ENV)))
    try:
        config = load_config()
        arguments = stage_arguments(stage)
        log(f"job {stage} starting{' ' + str(arguments) if arguments else ''}; effective config:")
        sys.stderr.write(dump_config(config))
        store = open_store(config.store)
        context = StageContext(config=config, store=store, scratch=scratch, force=force_from_env())
        result = STAGE_FUNCTIONS[stage](context, **arguments)
        status = "skipped (already complete)" if result.get("skipped") else "finished"
        log(f"job {stage} {status} in {time.perf_counter() - started:.1f}s")
        return EXIT_OK
    except StageTerminated:
        return report_terminated(stage, started)
    except Exception as exc:  # noqa: BLE001 - the one place errors become one line
        if was_terminated():
            log(f"job {stage}: SIGTERM surfaced as {type(exc).__name__}: {exc}")
            return report_terminated(stage, started)
        return report_error(exc, traceback=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report_terminated(stage: str, started: float) -> int:
    log(
        f"job {stage} terminated (SIGTERM) after {time.perf_counter() - started:.1f}s; "
        "its unfinished output is not marked complete and a rerun resumes it"
    )
    return EXIT_TERMINATED


def resolve_round() -> int:
    """The round to run: CODEQ_STORE__ROUND checked against the store, or the next one."""
    from codeq.config import load_config
    from codeq.pipeline.round_state import next_round, require_previous_finished
    from codeq.store import RoundLayout, open_store

    wanted = os.environ.get(ROUND_ENV, "").strip()
    if wanted in ("", NEXT_ROUND):
        os.environ.pop(ROUND_ENV, None)
    config = load_config()
    store = open_store(config.store)
    if wanted in ("", NEXT_ROUND):
        number = next_round(store, config.store.run)
        log(f"run {config.store.run}: the next round is {number}")
        return number
    require_previous_finished(store, RoundLayout(config.store.run, config.store.round))
    return config.store.round


STOP = "stop"  # what `jobs.round --continue` prints when the chain of rounds ends


def round_count(text: str, what: str) -> int:
    """A number of rounds (or a round number) given on the command line by the workflow."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{what}={text!r} is not a whole number",
            hint=f"set {what} to a number, e.g. -p {what}=3",
        ) from None


def continue_chain(first: str, rounds: str) -> str:
    """After the round CODEQ_STORE__ROUND of a chain that started at `first` and asked for
    `rounds` rounds: the next round's number, or STOP (the reason goes to the log)."""
    from codeq.config import load_config
    from codeq.pipeline.round_state import after_round
    from codeq.store import open_store

    config = load_config()
    step = after_round(
        open_store(config.store),
        config.store.run,
        config.store.round,
        first=round_count(first, "first"),
        rounds=round_count(rounds, "rounds"),
        patience=config.promotion.patience,
    )
    action = "stopping" if step.next_round is None else "going on"
    log(f"run {config.store.run}: {step.reason}; {action}")
    return STOP if step.next_round is None else str(step.next_round)


def round_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.round",
        description="Print the round a workflow runs (CODEQ_STORE__ROUND: next or N); with "
        "--continue, after round CODEQ_STORE__ROUND of a chain, the next round or 'stop'.",
    )
    parser.add_argument("--rounds", help="rounds the submission asked for (default 1)")
    parser.add_argument("--max-rounds", help="most rounds a submission may ask for")
    parser.add_argument("--continue", dest="go_on", action="store_true")
    parser.add_argument("--first", help="with --continue: the chain's first round")
    arguments = parser.parse_args(argv)
    if arguments.go_on and (arguments.first is None or arguments.rounds is None):
        parser.error("--continue needs --first and --rounds")
    return arguments


def round_output(arguments: argparse.Namespace) -> str:
    """What `python -m jobs.round` prints: the round to run, or after --continue the next one."""
    from codeq.pipeline.round_state import check_rounds_requested

    if arguments.go_on:
        return continue_chain(arguments.first, arguments.rounds)
    if arguments.rounds is not None:
        limit = arguments.max_rounds
        check_rounds_requested(
            round_count(arguments.rounds, "rounds"),
            None if limit is None else round_count(limit, "max-rounds"),
        )
    return str(resolve_round())


def main_round(argv: list[str] | None = None) -> None:
    """`python -m jobs.round`: print the round number (stdout) or fail with the exit code."""
    setup_logging()
    install_sigterm_handler()
    try:
        print(round_output(round_arguments(argv)), flush=True)
    except StageTerminated:
        sys.exit(EXIT_TERMINATED)
    except Exception as exc:  # noqa: BLE001 - reported like every job's error
        sys.exit(EXIT_TERMINATED if was_terminated() else report_error(exc, traceback=True))
    sys.exit(EXIT_OK)


def main(stage: str) -> None:
    setup_logging()
    install_sigterm_handler()
    sys.exit(run_stage(stage))
