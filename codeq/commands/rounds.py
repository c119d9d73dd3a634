from __future__ import annotations

from pathlib import Path

import typer

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
    from codeq.pipeline.local_round import run_rounds

    out = out.expanduser().resolve()
    config = local_config(source, out, run, model, max_items, 0)
    check_inputs(config)
    announce_settings(config)
    summaries = run_rounds(config, out, rounds, source=config.tasks.source)
    if not summaries:
        typer.echo(
            f"run {run} already has {rounds} finished round(s), or patience ran out", err=True
        )
    for summary in summaries:
        echo_round(summary)
