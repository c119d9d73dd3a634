from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from codeq.commands import common
from codeq.commands.common import key_option


def command(
    store_uri: str | None = key_option(
        "store.uri",
        "--store",
        help="Artifact store: file://PATH or s3://BUCKET/PREFIX.",
        metavar="URI",
    ),
    run: str | None = key_option("store.run", "--run", help="Run name.", metavar="NAME"),
    round_number: int | None = key_option(
        "store.round", "--round", help="Round number.", metavar="N", min=0
    ),
) -> None:
    """Promote the round's adapter to runs/<run>/current if it beats the incumbent."""
    from codeq.pipeline.stages import StageContext, promote_stage
    from codeq.store import open_store

    config = common.config_with({"store": {"uri": store_uri, "run": run, "round": round_number}})
    with tempfile.TemporaryDirectory(prefix="codeq-promote-") as scratch:
        context = StageContext(config=config, store=open_store(config.store), scratch=Path(scratch))
        decision = promote_stage(context)
    typer.echo(decision.get("reason", "promote: already decided for this round"))
