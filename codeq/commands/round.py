from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands import common


def command(
    source: str = typer.Option(
        "builtin",
        "--source",
        help="Task source: 'builtin' (tasks shipped with codeq) or a DebugBench folder.",
    ),
    out: Path = typer.Option(
        Path("codeq-runs/local"), "--out", help="Folder for the store, scratch files and report."
    ),
    round_number: int = typer.Option(0, "--round", min=0, help="Round number."),
    model: str | None = typer.Option(
        None, "--model", help="Policy model (default from the preset: 'smollm2')."
    ),
    run: str = typer.Option("local", "--run", help="Run name in the store."),
    max_items: int | None = typer.Option(
        None, "--max-items", min=1, help="Read at most N source items (quick DebugBench rounds)."
    ),
) -> None:
    """Run a whole round locally (settings preset codeq/data/local-round.yaml unless --config)."""
    from codeq.config import load_config
    from codeq.pipeline.local_round import LOCAL_ROUND_PRESET, run_round

    out = out.expanduser().resolve()
    overrides: dict[str, dict[str, object]] = {
        "store": {"uri": f"file://{out / 'store'}", "run": run, "round": round_number},
        "tasks": {"source": source, **({"max_items": max_items} if max_items else {})},
    }
    if model is not None:
        overrides["policy"] = {"model": model}
    config = load_config(common.STATE.config_file or LOCAL_ROUND_PRESET, overrides)
    summary = run_round(config, out, source=source)
    promote = summary["results"].get("promote", {})
    typer.echo(f"round {round_number} finished in {summary['seconds']:.0f}s", err=True)
    if promote.get("reason"):
        typer.echo(f"promotion: {promote['reason']}", err=True)
    typer.echo(f"report: {summary['report']}")
