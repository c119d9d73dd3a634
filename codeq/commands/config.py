from __future__ import annotations

import typer

from codeq.commands.common import config_with
from codeq.config import dump_config


def command() -> None:
    """Print the effective configuration (defaults < YAML file < CODEQ_* environment)."""
    typer.echo(dump_config(config_with()), nl=False)
