from __future__ import annotations

import json
from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    trajectories: list[Path] = typer.Argument(
        ..., help="Trajectory JSONL files or folders of shards (from `codeq collect`)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (default work_dir/pairs)."
    ),
    alpha: float | None = typer.Option(None, help="Q = alpha*Q_mcts + (1-alpha)*Q_ai."),
    min_value_gap: float | None = typer.Option(None, help="theta: minimum |dQ| of a pair."),
    max_pairs_per_task: int | None = typer.Option(None, help="Cap on pairs from one task."),
) -> None:
    """Turn trajectories into DPO preference pairs (pairs.jsonl + stats.json)."""
    from codeq.pairs import make_pairs

    config = config_with(
        {
            "pairs": {
                "alpha": alpha,
                "min_value_gap": min_value_gap,
                "max_pairs_per_task": max_pairs_per_task,
            }
        }
    )
    out_dir = out or Path(config.work_dir) / "pairs"
    stats = make_pairs(trajectories, out_dir, config)
    typer.echo(json.dumps({"out": str(out_dir), **{k: stats[k] for k in ("pairs", "dropped")}}))
