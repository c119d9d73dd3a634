from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from codeq.commands import common
from codeq.commands.round import (
    MAX_ITEMS_OPTION,
    MODEL_OPTION,
    OUT_OPTION,
    RUN_OPTION,
    SOURCE_OPTION,
    announce_settings,
    check_inputs,
    echo_round,
    local_config,
)

if TYPE_CHECKING:
    from codeq.pipeline.local_round import RoundsOutcome


def command(
    rounds: int = typer.Option(
        ...,
        "--rounds",
        min=1,
        help="Run until the run has this many finished rounds.",
        metavar="N",
    ),
    source: str | None = SOURCE_OPTION,
    out: Path = OUT_OPTION,
    model: str | None = MODEL_OPTION,
    run: str = RUN_OPTION,
    max_items: int | None = MAX_ITEMS_OPTION,
) -> None:
    """Run chained rounds locally: each starts from the policy the earlier ones promoted. Stops
    at --rounds finished rounds, or after promotion.patience rounds in a row without a
    promotion; rerun to resume."""
    from codeq.pipeline.local_round import RoundProgress, run_rounds

    progress = RoundProgress()
    common.STATE.progress = progress.describe
    out = out.expanduser().resolve()
    config = local_config(source, out, run, model, max_items, 0)
    check_inputs(config)
    announce_settings(config)
    outcome = run_rounds(config, out, rounds, source=config.tasks.source, progress=progress)
    for summary in outcome.summaries:
        echo_round(summary)
    typer.echo(outcome_line(outcome, rounds, run), err=True)


def outcome_line(outcome: RoundsOutcome, rounds: int, run: str) -> str:
    """Where the run stands after `codeq rounds`, and the command that goes on from there."""
    finished = outcome.finished
    if outcome.stopped_by_patience:
        return (
            f"run {run}: stopped with {finished} of {rounds} rounds finished: the last "
            f"{outcome.without_promotion} round(s) in a row promoted nothing, and "
            f"promotion.patience is {outcome.patience}. To go on, `{_command('round')}` runs "
            f"round {finished} anyway, or `CODEQ_PROMOTION__PATIENCE={outcome.patience + 1} "
            f"{_command('rounds', rounds)}` lets the chain go on"
        )
    if not outcome.summaries:
        return (
            f"run {run} already has {finished} finished round(s), so --rounds {rounds} has "
            f"nothing to do; `{_command('rounds', finished + 1)}` runs round {finished}"
        )
    return f"run {run}: {finished} of {rounds} rounds finished"


def _command(name: str, rounds: int | None = None) -> str:
    """This command line as `codeq round` (without --rounds) or `codeq rounds --rounds N`."""
    argv = list(common.STATE.argv or ["rounds"])
    at = argv.index("rounds") if "rounds" in argv else 0
    rest: list[str] = []
    options = iter(argv[at + 1 :])
    for arg in options:
        if arg == "--rounds":
            next(options, None)
        elif not arg.startswith("--rounds="):
            rest.append(arg)
    head = ["round"] if name == "round" else ["rounds", "--rounds", str(rounds)]
    return "codeq " + shlex.join([*argv[:at], *head, *rest])
