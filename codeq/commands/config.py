from __future__ import annotations

from pathlib import Path

import typer

from codeq.commands import common
from codeq.commands.common import config_with, explain_with
from codeq.config import dump_config
from codeq.errors import ConfigError


def command(
    explain: bool = typer.Option(
        False,
        "--explain",
        help="Above each key its help, beside it where its value came from "
        "(default, preset NAME, file PATH, env VAR).",
    ),
    run: str | None = typer.Option(
        None,
        "--run",
        help="Run name in the store.",
        metavar="NAME",
        show_default="none: the settings a command would use now",
    ),
    out: Path = typer.Option(
        Path("codeq-runs/local"),
        "--out",
        "-o",
        help="Output folder of the local run (`codeq round --out`) that --run names.",
        metavar="DIR",
        file_okay=False,
    ),
    round_number: int | None = typer.Option(
        None,
        "--round",
        help="Round number.",
        metavar="N",
        min=0,
        show_default="the run's latest finished round",
    ),
) -> None:
    """Print the effective configuration as YAML: defaults < preset < --config file < CODEQ_*
    environment. The output is itself a valid config file. With --run: the settings a finished
    local round of that run used (what stage commands given a path inside it use)."""
    if run is not None:
        settings, described = round_settings(out, run, round_number)
        common.STATE.config_file, common.STATE.round_settings = settings, described
        typer.echo(f"# the settings of {described}: {settings}", err=True)
    if explain:
        typer.echo(explain_with(), nl=False)
        return
    typer.echo(dump_config(config_with()), nl=False)


def round_settings(out: Path, run: str, round_number: int | None) -> tuple[Path, str]:
    """The settings file of a finished local round (the latest one by default)."""
    from codeq.pipeline.local_round import SETTINGS_NAME

    folder = out.expanduser() / "store" / "runs" / run
    found = {
        int(path.parent.name.removeprefix("round-")): path
        for path in folder.glob(f"round-*/{SETTINGS_NAME}")
        if path.parent.name.removeprefix("round-").isdigit()
    }
    if round_number is None and found:
        round_number = max(found)
    if round_number is None or round_number not in found:
        which = "no finished round" if round_number is None else f"no finished round {round_number}"
        raise ConfigError(
            f"run {run!r} has {which} with recorded settings under {folder}",
            hint="finished local rounds record them (`codeq round --run NAME`); pass the "
            "run's --out folder if it is not codeq-runs/local",
        )
    return found[round_number], f"round {round_number} of run {run}"
