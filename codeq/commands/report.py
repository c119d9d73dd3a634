from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands.common import config_with, out_dir, out_option


def command(
    eval_results: Path | None = typer.Option(
        None,
        "--eval",
        help="results.json (or its folder) of the evaluated adapter.",
        metavar="PATH",
    ),
    base_eval: Path | None = typer.Option(
        None,
        "--base-eval",
        help="results.json (or its folder) of the base model, same tasks.",
        metavar="PATH",
    ),
    train: Path | None = typer.Option(
        None, "--train", help="metrics.json (or its folder) of `codeq train`.", metavar="PATH"
    ),
    pairs: Path | None = typer.Option(
        None, "--pairs", help="stats.json (or its folder) of `codeq pairs`.", metavar="PATH"
    ),
    out: Path | None = out_option("report", "report.json, report.md and index.html"),
) -> None:
    """Render report.json, report.md and a self-contained index.html with plots."""
    from codeq.report import render_report

    config = config_with({})
    index = render_report(
        out_dir(out, config, "report"),
        results=eval_results,
        base_results=base_eval,
        train_metrics=train,
        pair_stats=pairs,
    )
    typer.echo(str(index))
