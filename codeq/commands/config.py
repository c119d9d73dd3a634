from __future__ import annotations

import typer

from codeq.commands.common import config_with, explain_with
from codeq.config import dump_config


def command(
    explain: bool = typer.Option(
        False,
        "--explain",
        help="Above each key its help, beside it where its value came from "
        "(default, preset NAME, file PATH, env VAR).",
    ),
) -> None:
    """Print the effective configuration as YAML: defaults < preset < --config file < CODEQ_*
    environment. The output is itself a valid config file."""
    if explain:
        typer.echo(explain_with(), nl=False)
        return
    typer.echo(dump_config(config_with()), nl=False)
