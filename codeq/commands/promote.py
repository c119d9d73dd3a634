from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from codeq.commands import common


def command(
    store_uri: str | None = typer.Option(None, "--store", help="Store URI (store.uri)."),
    run: str | None = typer.Option(None, "--run", help="Run name (store.run)."),
    round_number: int | None = typer.Option(None, "--round", min=0, help="Round (store.round)."),
) -> None:
    """Promote the round's adapter to runs/<run>/current if it beats the incumbent."""
    from codeq.pipeline.stages import StageContext, promote_stage
    from codeq.store import open_store

    config = common.config_with({"store": {"uri": store_uri, "run": run, "round": round_number}})
    with tempfile.TemporaryDirectory(prefix="codeq-promote-") as scratch:
        context = StageContext(config=config, store=open_store(config.store), scratch=Path(scratch))
        decision = promote_stage(context)
    typer.echo(decision.get("reason", "promote: already decided for this round"))
