from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands import common
from codeq.commands.common import key_option, model_option

PRESET = "laptop"  # the default preset of `codeq round` (codeq/data/presets/laptop.yaml)


def command(
    source: str | None = key_option(
        "tasks.source",
        "--source",
        help="Task source: 'builtin' (tasks shipped with codeq), a DebugBench folder, or a "
        "Hugging Face dataset id.",
        metavar="SOURCE",
        preset=PRESET,
    ),
    out: Path = typer.Option(
        Path("codeq-runs/local"),
        "--out",
        "-o",
        help="Output folder: the artifact store (OUT/store), scratch files and the report.",
        metavar="DIR",
        file_okay=False,
    ),
    round_number: int = typer.Option(0, "--round", help="Round number.", metavar="N", min=0),
    model: str | None = model_option(PRESET),
    run: str = typer.Option("local", "--run", help="Run name in the store.", metavar="NAME"),
    max_items: int | None = key_option(
        "tasks.max_items",
        "--max-items",
        help="Read at most N source items (quick DebugBench rounds).",
        metavar="N",
        min=1,
        preset=PRESET,
    ),
) -> None:
    """Run a whole round locally with the `laptop` preset unless --preset says otherwise; a
    --config file changes single keys of the preset."""
    from codeq.pipeline.local_round import run_round

    out = out.expanduser().resolve()
    config = common.config_with(
        {
            "store": {"uri": f"file://{out / 'store'}", "run": run, "round": round_number},
            "tasks": {"source": source, "max_items": max_items},
            "policy": {"model": model},
        },
        preset=PRESET,
    )
    preset = common.chosen_preset(PRESET)
    settings = f"preset {preset}" + (
        f" + file {common.STATE.config_file}" if common.STATE.config_file else ""
    )
    typer.echo(
        f"round {round_number}: {settings}, model {config.policy.model}, tasks "
        f"{config.tasks.source}, store {config.store.uri} (all settings: `codeq config "
        f"--preset {preset} --explain`)",
        err=True,
    )
    summary = run_round(config, out, source=config.tasks.source)
    promote = summary["results"].get("promote", {})
    typer.echo(f"round {round_number} finished in {summary['seconds']:.0f}s", err=True)
    if promote.get("reason"):
        typer.echo(f"promotion: {promote['reason']}", err=True)
    typer.echo(f"report: {summary['report']}")
