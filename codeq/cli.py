"""`codeq` command line: one sub-command per stage, one error handler for all of them.

Each command lives in `codeq/commands/<name>.py` and imports heavy libraries (torch,
transformers) inside its body, so `codeq --help` stays fast. Conventions every command follows
(tests/test_cli_help.py checks them): `-h`/`--help`; the stage's main input is a positional
argument; `--out/-o DIR` is always a folder; an option that sets a config key shows that key's
value as its default; `-c/--config` and `--preset` work before or after the command name.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

from codeq import __version__
from codeq.commands import common
from codeq.config_layers import preset_names

try:  # typer >= 0.20 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]
from codeq.errors import EXIT_BAD_INPUT, CodeQError
from codeq.logs import exit_at_once, print_error, report_error, setup_logging

# name -> (module, one-line help); the order is the data flow of a round.
COMMANDS: dict[str, tuple[str, str]] = {
    "config": (
        "codeq.commands.config",
        "Print the effective configuration (--explain: each key's help and origin).",
    ),
    "prepare": (
        "codeq.commands.prepare",
        "Build executable tasks from DebugBench: dedup, tests, split.",
    ),
    "exec": ("codeq.commands.exec", "Run one program against a task's tests in the sandbox."),
    "collect": (
        "codeq.commands.collect",
        "Search (MCTS or best-of-N) over tasks; write trajectories.",
    ),
    "pairs": ("codeq.commands.pairs", "Turn trajectories into DPO preference pairs."),
    "train": ("codeq.commands.train", "Train a LoRA adapter with DPO on preference pairs."),
    "merge": ("codeq.commands.merge", "Merge a LoRA adapter into its base model."),
    "evaluate": ("codeq.commands.evaluate", "Score modes on held-out tasks with hidden tests."),
    "promote": (
        "codeq.commands.promote",
        "Make the new adapter current if it beats the last round.",
    ),
    "report": ("codeq.commands.report", "Render the round report (JSON, Markdown, HTML)."),
    "round": ("codeq.commands.round", "Run a whole round locally: every stage, prepare to report."),
    "rounds": (
        "codeq.commands.rounds",
        "Run chained rounds locally until N rounds or no more promotions.",
    ),
    "cache": (
        "codeq.commands.cache",
        "List the merged policies in policy.cache_dir, or remove them.",
    ),
}

# Commands that choose and show their settings themselves; every other one (a stage) says on its
# first line which settings and model it uses, and takes a finished local round's settings when
# given a path inside that round.
OWN_SETTINGS = {"config", "cache", "round", "rounds"}

app = typer.Typer(
    name="codeq",
    help="CodeQ: self-improving code-debugging agent. Stages of a round, in order: "
    + " -> ".join(
        name
        for name in COMMANDS
        if name not in {"config", "exec", "merge", "round", "rounds", "cache"}
    )
    + ". `codeq round` runs them all locally.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

CONFIG_HELP = "YAML config file, layered over the preset (also CODEQ_CONFIG_FILE)."
PRESET_HELP = (
    f"Settings preset ({', '.join(preset_names())}) under the config file (also CODEQ_PRESET). "
    "Default: laptop for `round` and `rounds`, production elsewhere."
)


def _config_option() -> Any:
    return typer.Option(None, "--config", "-c", help=CONFIG_HELP, metavar="FILE", dir_okay=False)


def _preset_option() -> Any:
    return typer.Option(None, "--preset", help=PRESET_HELP, metavar="NAME")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"codeq {__version__}")
        raise typer.Exit(0)


@app.callback()
def _global_options(
    config: Path | None = _config_option(),
    preset: str | None = _preset_option(),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    common.STATE.config_file = config
    common.STATE.preset = preset
    setup_logging(verbose)


def _with_config_options(name: str, function: Callable[..., None]) -> Callable[..., None]:
    """The command, also taking -c/--config and --preset after its name (they win over the
    same options given before it)."""
    signature = inspect.signature(function, eval_str=True)
    extra = [
        inspect.Parameter(
            "config_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=_config_option(),
            annotation=Path | None,
        ),
        inspect.Parameter(
            "preset",
            inspect.Parameter.KEYWORD_ONLY,
            default=_preset_option(),
            annotation=str | None,
        ),
    ]

    @functools.wraps(function)
    def command(
        *args: Any, config_file: Path | None = None, preset: str | None = None, **kwargs: Any
    ) -> None:
        if config_file is not None:
            common.STATE.config_file = config_file
        if preset is not None:
            common.STATE.preset = preset
        common.STATE.command = name
        if name not in OWN_SETTINGS:
            common.use_round_settings([*args, *kwargs.values()])
            common.STATE.announce = True
        function(*args, **kwargs)

    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *extra]
    )
    command.__annotations__ = {
        **{name: p.annotation for name, p in signature.parameters.items()},
        "config_file": Path | None,
        "preset": str | None,
    }
    return command


for _name, (_module, _help) in COMMANDS.items():
    app.command(_name, short_help=_help)(
        _with_config_options(_name, importlib.import_module(_module).command)
    )


def _fail(message: str, hint: str | None, code: int) -> int:
    print_error(message, hint)
    return code


# What a rerun of an interrupted command keeps (the rest starts over).
_ROUND_RESUME = "finished stages are skipped; collect and evaluate keep the tasks they finished"
RESUMES = {
    "round": _ROUND_RESUME,
    "rounds": _ROUND_RESUME,
    "collect": "it skips the tasks it finished",
    "evaluate": "it skips the tasks it searched",
}


@contextlib.contextmanager
def _stop_signals(received: list[int]) -> Iterator[None]:
    """While a command runs, SIGINT (Ctrl-C) and SIGTERM raise KeyboardInterrupt, so every
    `finally` on the way out runs (sandbox workers stopped, no completion marker written), and
    are recorded in `received`: an interrupt that library code turns into another error is still
    an interrupt. A second SIGTERM is ignored so it cannot cut that clean-up short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        if signum == signal.SIGTERM:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        received.append(signum)
        raise KeyboardInterrupt

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupted(signum: int, argv: list[str]) -> int:
    """One line: what finished, and the command that resumes; exit 128 + the signal."""
    command = common.STATE.command
    done = common.STATE.progress() if common.STATE.progress else None
    what = done or (f"`codeq {command}` stopped before it finished" if command else "stopped")
    keeps = RESUMES.get(command or "", "it starts over")
    print_error(
        f"interrupted ({signal.Signals(signum).name}): {what}; to resume, run the same "
        f"command again: codeq {shlex.join(argv)} ({keeps})"
    )
    return 128 + signum


def _failed(exc: BaseException) -> int:
    if isinstance(exc, CodeQError):
        return report_error(exc, traceback=False)
    if isinstance(exc, typer.Exit):
        return int(exc.exit_code)
    if isinstance(exc, typer.Abort):
        return _fail("aborted", None, 130)
    if isinstance(exc, click_exceptions.ClickException):
        context = getattr(exc, "ctx", None)
        command = context.command_path if context is not None else "codeq COMMAND"
        return _fail(exc.format_message(), f"run `{command} --help` for usage", EXIT_BAD_INPUT)
    if isinstance(exc, Exception):  # unexpected errors become one line too
        return report_error(exc, traceback=logging.getLogger().isEnabledFor(logging.DEBUG))
    raise exc


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; `main` exits with it). Ctrl-C or
    SIGTERM exits 130 or 143 with one line saying what finished and how to resume."""
    argv = list(sys.argv[1:] if argv is None else argv)
    common.STATE.command, common.STATE.progress, common.STATE.argv = None, None, argv
    common.STATE.round_settings, common.STATE.announce = None, False
    received: list[int] = []
    with _stop_signals(received):
        try:
            # typer turns a KeyboardInterrupt into the return value 130
            result = app(args=argv, prog_name="codeq", standalone_mode=False)
        except (Exception, KeyboardInterrupt, typer.Exit, typer.Abort) as exc:
            if received or isinstance(exc, KeyboardInterrupt):
                return _interrupted(received[0] if received else signal.SIGINT, argv)
            return _failed(exc)
    if received or result == 128 + signal.SIGINT:
        return _interrupted(received[0] if received else signal.SIGINT, argv)
    return result if isinstance(result, int) else 0


def main() -> None:
    code = run()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        # An interrupt that lands while a library runs Python code through the C API (heavy
        # imports do) can leave the interpreter set to kill itself with SIGINT at exit, whatever
        # the exit code; the clean-up has run, so leave now with the code that says what happened.
        exit_at_once(code)
    sys.exit(code)
