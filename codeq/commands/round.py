from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from codeq.commands import common

if TYPE_CHECKING:
    from codeq.config import CodeQConfig

SOURCE_OPTION = typer.Option(
    "builtin",
    "--source",
    help="Task source: 'builtin' (tasks shipped with codeq) or a DebugBench folder.",
)
OUT_OPTION = typer.Option(
    Path("codeq-runs/local"), "--out", help="Folder for the store, scratch files and report."
)
MODEL_OPTION = typer.Option(
    None, "--model", help="Policy model (default from the preset: 'smollm2')."
)
RUN_OPTION = typer.Option("local", "--run", help="Run name in the store.")
MAX_ITEMS_OPTION = typer.Option(
    None, "--max-items", min=1, help="Read at most N source items (quick DebugBench rounds)."
)


def local_config(
    source: str, out: Path, run: str, model: str | None, max_items: int | None, round_number: int
) -> CodeQConfig:
    """The local round's config: the preset (or --config), with the store in OUT/store."""
    from codeq.config import load_config
    from codeq.pipeline.local_round import LOCAL_ROUND_PRESET

    overrides: dict[str, dict[str, object]] = {
        "store": {"uri": f"file://{out / 'store'}", "run": run, "round": round_number},
        "tasks": {"source": source, **({"max_items": max_items} if max_items else {})},
    }
    if model is not None:
        overrides["policy"] = {"model": model}
    return load_config(common.STATE.config_file or LOCAL_ROUND_PRESET, overrides)


def command(
    source: str = SOURCE_OPTION,
    out: Path = OUT_OPTION,
    round_number: int | None = typer.Option(
        None, "--round", min=0, help="Round number (default: the run's next unfinished round)."
    ),
    model: str | None = MODEL_OPTION,
    run: str = RUN_OPTION,
    max_items: int | None = MAX_ITEMS_OPTION,
) -> None:
    """Run one whole round locally (settings preset codeq/data/local-round.yaml unless --config),
    starting from the policy promoted by the run's earlier rounds."""
    from codeq.pipeline.local_round import run_round
    from codeq.pipeline.round_state import next_round
    from codeq.store import open_store

    out = out.expanduser().resolve()
    config = local_config(source, out, run, model, max_items, round_number or 0)
    if round_number is None:
        number = next_round(open_store(config.store), run)
        config = config.model_copy(
            update={"store": config.store.model_copy(update={"round": number})}
        )
    summary = run_round(config, out, source=source)
    echo_round(summary)


def echo_round(summary: dict[str, object]) -> None:
    promote = summary["results"].get("promote", {})  # type: ignore[attr-defined]
    typer.echo(f"round {summary['round']} finished in {summary['seconds']:.0f}s", err=True)
    if promote.get("reason"):
        typer.echo(f"promotion: {promote['reason']}", err=True)
    typer.echo(f"report: {summary['report']}")
