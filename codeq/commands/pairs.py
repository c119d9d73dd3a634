from __future__ import annotations

import json
from pathlib import Path

import typer

from codeq.commands.common import config_with, key_option, out_dir, out_option
from codeq.errors import StageFailedError


def command(
    trajectories: list[Path] = typer.Argument(
        ...,
        help="Trajectory JSONL files or folders of them (the --out folder of `codeq collect`).",
        metavar="TRAJECTORIES",
    ),
    out: Path | None = out_option("pairs", "pairs.jsonl and stats.json"),
    alpha: float | None = key_option(
        "pairs.alpha", "--alpha", help="Q = alpha*Q_mcts + (1-alpha)*Q_ai.", metavar="A"
    ),
    min_value_gap: float | None = key_option(
        "pairs.min_value_gap",
        "--min-value-gap",
        help="theta: a pair needs |Q_chosen - Q_rejected| > theta.",
        metavar="THETA",
    ),
    max_pairs_per_task: int | None = key_option(
        "pairs.max_pairs_per_task",
        "--max-pairs-per-task",
        help="Cap on pairs from one task.",
        metavar="N",
    ),
) -> None:
    """Turn trajectories into DPO preference pairs (pairs.jsonl + stats.json)."""
    from codeq.pairs import describe_dropped, make_pairs

    config = config_with(
        {
            "pairs": {
                "alpha": alpha,
                "min_value_gap": min_value_gap,
                "max_pairs_per_task": max_pairs_per_task,
            }
        }
    )
    folder = out_dir(out, config, "pairs")
    stats = make_pairs(trajectories, folder, config)
    typer.echo(json.dumps({"out": str(folder), **{k: stats[k] for k in ("pairs", "dropped")}}))
    if stats["pairs"] == 0:
        raise StageFailedError(
            f"no preference pairs from {stats['trajectories']} trajectories"
            f" (dropped: {describe_dropped(stats['dropped'])}); `codeq train` would have nothing"
            " to learn from",
            hint="siblings need clearly different values: lower --min-value-gap, or collect "
            "with more --rollouts so trees have siblings",
        )
