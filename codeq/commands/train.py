from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import typer

from codeq.commands.common import config_with, key_option, model_option, out_dir, out_option


def command(
    pairs: Path = typer.Argument(
        ..., help="pairs.jsonl (or its folder) from `codeq pairs`.", metavar="PAIRS"
    ),
    out: Path | None = out_option("train", "adapter/ and metrics.json"),
    model: str | None = model_option(),
    max_steps: int | None = key_option(
        "train.max_steps",
        "--max-steps",
        help="Stop after N optimizer steps (-1: train.epochs).",
        metavar="N",
    ),
    learning_rate: float | None = key_option(
        "train.learning_rate", "--learning-rate", help="DPO learning rate.", metavar="LR"
    ),
    precision: Literal["bf16", "fp32"] | None = key_option(
        "train.precision",
        "--precision",
        help="bf16 (with fp32 log-probabilities) or full fp32.",
        metavar="[bf16|fp32]",
    ),
    max_length: int | None = key_option(
        "train.max_length",
        "--max-length",
        help="Longer pairs are dropped and counted, never truncated.",
        metavar="TOKENS",
    ),
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
    metrics: dict[str, Any] = train_dpo(pairs, out_dir(out, config, "train"), config)
    summary = {
        key: metrics[key]
        for key in ("adapter", "global_steps", "heldout_reward_accuracy", "pairs", "train_loss")
    }
    typer.echo(json.dumps(summary))
