from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands.common import config_with


def command(
    eval_results: Path | None = typer.Option(
        None, "--eval", help="results.json (or folder) of the evaluated adapter."
    ),
    base_eval: Path | None = typer.Option(
        None, "--base-eval", help="results.json (or folder) of the base model, same tasks."
    ),
    train: Path | None = typer.Option(
        None, "--train", help="metrics.json (or folder) of `codeq train`."
    ),
    pairs: Path | None = typer.Option(
        None, "--pairs", help="stats.json (or folder) of `codeq pairs`."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output folder (default work_dir/report)."
    ),
) -> None:
    """Render report.json, report.md and a self-contained index.html with plots."""
    from codeq.report import render_report

    config = config_with({})
    out_dir = out or Path(config.work_dir) / "report"
    index = render_report(
        out_dir, results=eval_results, base_results=base_eval, train_metrics=train, pair_stats=pairs
    )
    typer.echo(str(index))
