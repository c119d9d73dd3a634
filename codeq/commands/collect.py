"""`codeq collect`: search a tasks file (one shard of it) and append trajectories as JSONL."""

from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    tasks: Path = typer.Option(..., "--tasks", help="Tasks JSONL (e.g. tasks/train.jsonl)."),
    out: Path = typer.Option(..., "--out", help="Trajectories JSONL; resumed if it exists."),
    shard_index: int = typer.Option(0, "--shard-index", help="This shard (0-based)."),
    shard_count: int = typer.Option(1, "--shard-count", help="Number of shards."),
    mode: str | None = typer.Option(None, "--mode", help="mcts | bon (default: search.mode)."),
    rollouts: int | None = typer.Option(
        None, "--rollouts", help="MCTS rollouts per task (for bon: N samples)."
    ),
    model: str | None = typer.Option(None, "--model", help="Policy model (id, folder, .gguf)."),
    adapter: str | None = typer.Option(None, "--adapter", help="LoRA adapter folder."),
    max_tasks: int | None = typer.Option(None, "--max-tasks", help="Search at most N tasks."),
) -> None:
    """Search (MCTS or best-of-N) over tasks; write trajectories."""
    config = config_with(
        {
            "policy": {"model": model, "adapter": adapter},
            "search": {"mode": mode},
        }
    )
    from codeq.search import collect

    summary = collect(
        tasks,
        out,
        config,
        shard_index=shard_index,
        shard_count=shard_count,
        mode=mode,
        rollouts=rollouts,
        max_tasks=max_tasks,
    )
    typer.echo(
        f"collect: {summary['searched']} task(s) searched, {summary['skipped']} already done, "
        f"{summary['solved']} solved ({summary['solve_rate']:.0%}); "
        f"{summary['completion_tokens']} completion tokens in {summary['seconds']:.0f}s "
        f"-> {summary['out']}"
    )
