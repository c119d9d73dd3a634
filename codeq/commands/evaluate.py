from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import typer

from codeq.commands.common import config_with, key_option, model_option, out_dir, out_option
from codeq.config import EvalMode


def command(
    tasks: Path = typer.Argument(
        ...,
        help="test.jsonl or validation.jsonl (or the tasks folder: its test.jsonl).",
        metavar="TASKS",
    ),
    out: Path | None = out_option("eval", "results.json"),
    adapter: Path | None = key_option(
        "policy.adapter",
        "--adapter",
        help="LoRA adapter to evaluate on top of the base model.",
        metavar="DIR",
    ),
    model: str | None = model_option(),
    modes: str | None = key_option(
        "evaluate.modes",
        "--modes",
        help=f"Comma-separated evaluation modes, of {','.join(get_args(EvalMode))}.",
        metavar="MODES",
    ),
    max_tasks: int | None = key_option(
        "evaluate.max_tasks",
        "--max-tasks",
        help="Evaluate at most N test tasks.",
        metavar="N",
        min=1,
    ),
    rollouts: int | None = key_option(
        "search.rollouts",
        "--rollouts",
        help="MCTS rollouts per task of the primary mcts figure.",
        metavar="N",
        min=1,
    ),
) -> None:
    """Score every mode on the same held-out tasks with hidden tests; writes OUT/results.json."""
    from codeq.evaluate import evaluate
    from codeq.evaluate.results import Split

    config = config_with(
        {
            "policy": {"model": model},
            "search": {"rollouts": rollouts},
            "evaluate": {
                "modes": [m.strip() for m in modes.split(",") if m.strip()] if modes else None,
                "max_tasks": max_tasks,
            },
        }
    )
    folder = out_dir(out, config, "eval")
    split: Split = "validation" if tasks.name.startswith("validation") else "test"
    results = evaluate(tasks, folder, config, split=split, adapter=adapter)
    summary = {
        mode: stats.model_dump(include={"n", "solved", "solve_rate", "ci_low", "ci_high"})
        for mode, stats in results.modes.items()
    }
    typer.echo(json.dumps({"out": str(folder / "results.json"), "modes": summary}))
