from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from codeq.commands import common
from codeq.commands.common import key_option, model_option

if TYPE_CHECKING:
    from codeq.config import CodeQConfig

PRESET = "laptop"  # the default preset of `codeq round(s)` (codeq/data/presets/laptop.yaml)

SOURCE_OPTION = key_option(
    "tasks.source",
    "--source",
    help="Task source: 'builtin' (tasks shipped with codeq), a DebugBench folder, or a "
    "Hugging Face dataset id.",
    metavar="SOURCE",
    preset=PRESET,
)
OUT_OPTION = typer.Option(
    Path("codeq-runs/local"),
    "--out",
    "-o",
    help="Output folder: the artifact store (OUT/store), scratch files and the report.",
    metavar="DIR",
    file_okay=False,
)
MODEL_OPTION = model_option(PRESET)
RUN_OPTION = typer.Option("local", "--run", help="Run name in the store.", metavar="NAME")
FORCE_OPTION = typer.Option(
    False,
    "--force",
    help="Recompute every stage of the round, replacing outputs an earlier run made (by "
    "default a stage whose output was made with another config or other inputs is refused).",
)
MAX_ITEMS_OPTION = key_option(
    "tasks.max_items",
    "--max-items",
    help="Read at most N source items (quick DebugBench rounds).",
    metavar="N",
    min=1,
    preset=PRESET,
)


def local_config(
    source: str | None,
    out: Path,
    run: str,
    model: str | None,
    max_items: int | None,
    round_number: int,
) -> CodeQConfig:
    """The local round's config: the `laptop` preset (or --preset), a --config file over it,
    CODEQ_* variables and the flags, with the store in OUT/store."""
    return common.config_with(
        {
            "store": {"uri": f"file://{out / 'store'}", "run": run, "round": round_number},
            "tasks": {"source": source, "max_items": max_items},
            "policy": {"model": model},
        },
        preset=PRESET,
    )


def check_inputs(config: CodeQConfig) -> None:
    """A missing or mistyped model or task source fails now, in one line, not after the
    round's first stages."""
    from codeq.policy.source import check_model_source
    from codeq.tasks.loaders import check_task_source

    check_task_source(config.tasks.source)
    check_model_source(config.policy.model)


def announce_settings(config: CodeQConfig) -> None:
    preset = common.chosen_preset(PRESET)
    settings = f"preset {preset}" + (
        f" + file {common.STATE.config_file}" if common.STATE.config_file else ""
    )
    typer.echo(
        f"run {config.store.run}: {settings}, model {config.policy.model}, tasks "
        f"{config.tasks.source}, store {config.store.uri} (all settings: `codeq config "
        f"--preset {preset} --explain`)",
        err=True,
    )


def command(
    source: str | None = SOURCE_OPTION,
    out: Path = OUT_OPTION,
    round_number: int | None = typer.Option(
        None,
        "--round",
        help="Round number.",
        metavar="N",
        min=0,
        show_default="the run's next unfinished round",
    ),
    model: str | None = MODEL_OPTION,
    run: str = RUN_OPTION,
    max_items: int | None = MAX_ITEMS_OPTION,
    force: bool = FORCE_OPTION,
) -> None:
    """Run one whole round locally, starting from the policy promoted by the run's earlier
    rounds. Settings: the `laptop` preset unless --preset says otherwise; a --config file
    changes single keys of the preset."""
    from codeq.pipeline.local_round import RoundProgress, run_round
    from codeq.pipeline.round_state import next_round
    from codeq.store import open_store

    progress = RoundProgress()
    common.STATE.progress = progress.describe
    out = out.expanduser().resolve()
    config = local_config(source, out, run, model, max_items, round_number or 0)
    check_inputs(config)
    if round_number is None:
        number = next_round(open_store(config.store), run)
        config = config.as_round(number)
    announce_settings(config)
    summary = run_round(config, out, source=config.tasks.source, force=force, progress=progress)
    echo_round(summary)


def echo_round(summary: dict[str, object]) -> None:
    promote = summary["results"].get("promote", {})  # type: ignore[attr-defined]
    typer.echo(f"round {summary['round']} finished in {summary['seconds']:.0f}s", err=True)
    if promote.get("reason"):
        typer.echo(f"promotion: {promote['reason']}", err=True)
    typer.echo(f"report: {summary['report']}")
