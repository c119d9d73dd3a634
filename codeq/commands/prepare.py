"""`codeq prepare [--source DIR_OR_HF_ID] [--out DIR] [--seed N] [--test-fraction F]`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from codeq.commands.common import config_with, key_option, out_dir, out_option


def command(
    source: str | None = key_option(
        "tasks.source",
        "--source",
        help="DebugBench clone (or its benchmark/ folder), a Hugging Face dataset id, or "
        "'builtin' (tasks shipped with codeq).",
        metavar="SOURCE",
    ),
    out: Path | None = out_option(
        "tasks", "train.jsonl, validation.jsonl, test.jsonl and report.json"
    ),
    seed: int | None = key_option(
        "tasks.seed", "--seed", help="Split and hidden-test synthesis seed.", metavar="N"
    ),
    test_fraction: float | None = key_option(
        "tasks.test_fraction",
        "--test-fraction",
        help="Fraction of problem slugs held out for testing.",
        metavar="F",
    ),
    max_items: int | None = key_option(
        "tasks.max_items",
        "--max-items",
        help="Read at most N source items (quick runs).",
        metavar="N",
        min=1,
    ),
) -> None:
    """Build executable tasks from DebugBench: dedup, hidden tests, split by problem."""
    from codeq.tasks import prepare
    from codeq.tasks.pipeline import SPLITS

    config = config_with(
        {
            "tasks": {
                "source": source,
                "seed": seed,
                "test_fraction": test_fraction,
                "max_items": max_items,
            }
        }
    )
    folder = out_dir(out, config, "tasks")
    report = prepare(config.tasks.source, folder, config)
    summary = {
        key: report[key]
        for key in ("items_read", "unique", "usable", "usable_fraction", "dropped_by_reason")
    }
    for split in SPLITS:
        summary[f"{split}_tasks"] = report[split]["tasks"]
    summary["seconds"] = report["seconds"]
    typer.echo(json.dumps(summary))
    written = [str(folder / f"{split}.jsonl") for split in SPLITS] + [str(folder / "report.json")]
    typer.echo(f"wrote {', '.join(written)}", err=True)
