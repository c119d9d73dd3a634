from __future__ import annotations

import json
from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    tasks: Path = typer.Argument(
        ..., help="test.jsonl or validation.jsonl (or the tasks folder: its test.jsonl)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (default work_dir/eval)."
    ),
    adapter: Path | None = typer.Option(None, help="LoRA adapter to evaluate on top of the base."),
    model: str | None = typer.Option(
        None, help="Base model (policy.model): HF id, folder, .gguf, smollm2."
    ),
    modes: str | None = typer.Option(
        None, help="Comma-separated: zero_shot,full_rewrite,mcts,bon."
    ),
    max_tasks: int | None = typer.Option(None, help="Evaluate at most N test tasks."),
    rollouts: int | None = typer.Option(None, help="MCTS rollouts of the primary mcts figure."),
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
    out_dir = out or Path(config.work_dir) / "eval"
    split: Split = "validation" if tasks.name.startswith("validation") else "test"
    results = evaluate(tasks, out_dir, config, split=split, adapter=adapter)
    summary = {
        mode: stats.model_dump(include={"n", "solved", "solve_rate", "ci_low", "ci_high"})
        for mode, stats in results.modes.items()
    }
    typer.echo(json.dumps({"out": str(out_dir / "results.json"), "modes": summary}))
