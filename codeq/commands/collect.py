"""`codeq collect`: search a tasks file (one shard of it) and append trajectories as JSONL."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from codeq.commands.common import config_with, key_option, model_option, out_dir, out_option

TRAJECTORIES_FILE = "trajectories.jsonl"


def trajectories_file(folder: Path, shard_index: int, shard_count: int) -> Path:
    """OUT/trajectories.jsonl, or OUT/shard-<i>/trajectories.jsonl when sharded (the layout
    `codeq pairs OUT` reads)."""
    if shard_count == 1:
        return folder / TRAJECTORIES_FILE
    return folder / f"shard-{shard_index}" / TRAJECTORIES_FILE


def command(
    tasks: Path = typer.Argument(
        ..., help="Tasks JSONL from `codeq prepare` (e.g. tasks/train.jsonl).", metavar="TASKS"
    ),
    out: Path | None = out_option(
        "trajectories",
        f"{TRAJECTORIES_FILE} (shard-<i>/{TRAJECTORIES_FILE} when sharded); a rerun resumes it",
    ),
    shard_index: int = typer.Option(
        0, "--shard-index", help="This shard (0-based).", metavar="I", min=0
    ),
    shard_count: int = typer.Option(
        1, "--shard-count", help="Number of shards.", metavar="N", min=1
    ),
    mode: Literal["mcts", "bon", "mt_bon"] | None = key_option(
        "search.mode",
        "--mode",
        help="Tree search, best-of-N sampling or multi-turn best-of-N.",
        metavar="[mcts|bon|mt_bon]",
    ),
    rollouts: int | None = key_option(
        "search.rollouts",
        "--rollouts",
        help="MCTS rollouts per task (for bon: N samples, default search.bon_samples; for "
        "mt_bon: turns, default search.mt_bon_turns).",
        metavar="N",
        min=1,
    ),
    model: str | None = model_option(),
    adapter: Path | None = key_option(
        "policy.adapter", "--adapter", help="LoRA adapter folder to apply.", metavar="DIR"
    ),
    max_tasks: int | None = key_option(
        "search.max_tasks",
        "--max-tasks",
        help="Search at most N tasks of the shard.",
        metavar="N",
        min=1,
    ),
) -> None:
    """Search (MCTS, best-of-N or multi-turn best-of-N) over tasks; write trajectories."""
    config = config_with(
        {
            "policy": {"model": model, "adapter": str(adapter) if adapter else None},
            "search": {"mode": mode, "max_tasks": max_tasks},
        }
    )
    if rollouts is not None:  # the search's size: MCTS rollouts, best-of-N's N, or the turns
        size_key = {"bon": "bon_samples", "mt_bon": "mt_bon_turns"}.get(
            config.search.mode, "rollouts"
        )
        config = config.derive(search={size_key: rollouts})
    from codeq.search import collect

    summary = collect(
        tasks,
        trajectories_file(out_dir(out, config, "trajectories"), shard_index, shard_count),
        config,
        shard_index=shard_index,
        shard_count=shard_count,
    )
    typer.echo(
        f"collect: {summary['searched']} task(s) searched, {summary['skipped']} already done, "
        f"{summary['solved']} solved ({summary['solve_rate']:.0%}); "
        f"{summary['completion_tokens']} completion tokens in {summary['seconds']:.0f}s "
        f"-> {summary['out']}"
    )
