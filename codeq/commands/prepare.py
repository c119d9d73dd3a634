"""`codeq prepare --source DIR_OR_HF_ID --out DIR [--seed N] [--test-fraction F]`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    source: str | None = typer.Option(
        None,
        "--source",
        help="DebugBench clone (or its benchmark/ folder), a Hugging Face dataset id, or "
        "'builtin'; default tasks.source.",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Folder for train.jsonl, validation.jsonl, test.jsonl, report.json."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Split and synthesis seed (tasks.seed)."),
    test_fraction: float | None = typer.Option(
        None, "--test-fraction", help="Fraction of problem slugs held out (tasks.test_fraction)."
    ),
    max_items: int | None = typer.Option(
        None, "--max-items", help="Read at most this many items (tasks.max_items)."
    ),
) -> None:
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
    report = prepare(config.tasks.source, out, config)
    summary = {
        key: report[key]
        for key in ("items_read", "unique", "usable", "usable_fraction", "dropped_by_reason")
    }
    for split in SPLITS:
        summary[f"{split}_tasks"] = report[split]["tasks"]
    summary["seconds"] = report["seconds"]
    typer.echo(json.dumps(summary))
    written = [str(out / f"{split}.jsonl") for split in SPLITS] + [str(out / "report.json")]
    typer.echo(f"wrote {', '.join(written)}", err=True)
