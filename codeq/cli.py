"""`codeq` command line: one sub-command per stage, one error handler for all of them.

Each command lives in `codeq/commands/<name>.py` and imports heavy libraries (torch,
transformers) inside its body, so `codeq --help` stays fast.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import typer

from codeq.commands import common

try:  # typer >= 0.20 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]
from codeq.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, CodeQError

# name -> (module, one-line help); the order is the data flow of a round.
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("codeq.commands.config", "Print the effective configuration as YAML."),
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
    "round": ("codeq.commands.round", "Run a whole round locally: prepare -> ... -> report."),
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
)


@app.callback()
def _global_options(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config file (also CODEQ_CONFIG_FILE).", dir_okay=False
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    common.STATE.config_file = config
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


for _name, (_module, _help) in COMMANDS.items():
    app.command(_name, help=_help)(importlib.import_module(_module).command)


def _fail(message: str, hint: str | None, code: int) -> int:
    typer.echo(f"error: {message}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    return code


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; `main` exits with it)."""
    try:
        app(args=argv, standalone_mode=False)
    except CodeQError as exc:
        return _fail(exc.message, exc.hint, exc.exit_code)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        return _fail("aborted", None, 130)
    except click_exceptions.ClickException as exc:
        return _fail(exc.format_message(), "run `codeq COMMAND --help` for usage", EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        return _fail("interrupted", None, 130)
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors become one line
        logging.getLogger("codeq").debug("unexpected error", exc_info=True)
        return _fail(
            f"unexpected {type(exc).__name__}: {exc}",
            "this is a bug in codeq; rerun with -v for the traceback",
            EXIT_INTERNAL,
        )
    return 0


def main() -> None:
    sys.exit(run())
