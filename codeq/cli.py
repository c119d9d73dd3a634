"""`codeq` command line: one sub-command per stage, one error handler for all of them.

Each command lives in `codeq/commands/<name>.py` and imports heavy libraries (torch,
transformers) inside its body, so `codeq --help` stays fast. Conventions every command follows
(tests/test_cli_help.py checks them): `-h`/`--help`; the stage's main input is a positional
argument; `--out/-o DIR` is always a folder; an option that sets a config key shows that key's
value as its default; `-c/--config` and `--preset` work before or after the command name.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
from collections.abc import Callable
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
from codeq.logs import print_error, report_error, setup_logging

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
}

app = typer.Typer(
    name="codeq",
    help="CodeQ: self-improving code-debugging agent. Stages of a round, in order: "
    + " -> ".join(
        name for name in COMMANDS if name not in {"config", "exec", "merge", "round", "rounds"}
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


def _with_config_options(function: Callable[..., None]) -> Callable[..., None]:
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
        _with_config_options(importlib.import_module(_module).command)
    )


def _fail(message: str, hint: str | None, code: int) -> int:
    print_error(message, hint)
    return code


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; `main` exits with it)."""
    try:
        app(args=argv, prog_name="codeq", standalone_mode=False)
    except CodeQError as exc:
        return report_error(exc, traceback=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return _fail("aborted", None, 130)
    except click_exceptions.ClickException as exc:
        context = getattr(exc, "ctx", None)
        command = context.command_path if context is not None else "codeq COMMAND"
        return _fail(exc.format_message(), f"run `{command} --help` for usage", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", None, 130)
    except Exception as exc:  # noqa: BLE001 - unexpected errors become one line too
        return report_error(exc, traceback=logging.getLogger().isEnabledFor(logging.DEBUG))
    return 0


def main() -> None:
    sys.exit(run())
