from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from codeq.commands.common import config_with


def command(
    pairs: Path = typer.Argument(..., help="pairs.jsonl (or its folder) from `codeq pairs`."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (default work_dir/train)."
    ),
    model: str | None = typer.Option(
        None, help="Base model (policy.model): HF id, folder, .gguf, smollm2."
    ),
    max_steps: int | None = typer.Option(None, help="Stop after N optimizer steps."),
    learning_rate: float | None = typer.Option(None, help="Learning rate."),
    precision: str | None = typer.Option(None, help="bf16 (fp32 log-probs) or fp32."),
    max_length: int | None = typer.Option(None, help="Longer pairs are dropped and counted."),
) -> None:
    """Train a LoRA adapter with DPO; writes OUT/adapter and OUT/metrics.json."""
    from codeq.train import train_dpo

    config = config_with(
        {
            "policy": {"model": model},
            "train": {
                "max_steps": max_steps,
                "learning_rate": learning_rate,
                "precision": precision,
                "max_length": max_length,
            },
        }
    )
    out_dir = out or Path(config.work_dir) / "train"
    metrics: dict[str, Any] = train_dpo(pairs, out_dir, config)
    summary = {
        key: metrics[key]
        for key in ("adapter", "global_steps", "heldout_reward_accuracy", "pairs", "train_loss")
    }
    typer.echo(json.dumps(summary))
