"""State shared by commands: --config and --preset, config loading with flag overrides, and the
option helpers that keep option names, metavars and shown defaults the same in every command."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from codeq.config import CodeQConfig, explain_config, load_config
from codeq.config_layers import (
    CONFIG_FILE_ENV,
    DEFAULT_PRESET,
    PRESET_ENV,
    PRESETS_DIR,
    read_yaml_mapping,
    sub_model,
)
from codeq.errors import StageFailedError


@dataclass
class CliState:
    config_file: Path | None = None
    preset: str | None = None
    command: str | None = None  # the running command's name
    argv: list[str] | None = None  # the command line after `codeq`
    progress: Callable[[], str] | None = None  # what it has finished, for an interrupt's line
    round_settings: str | None = None  # "round N of run R" when config_file is its settings
    announce: bool = False  # say on the first line which settings and model the command uses


STATE = CliState()


def chosen_preset(default: str = DEFAULT_PRESET) -> str:
    """--preset, else CODEQ_PRESET, else the command's default."""
    return STATE.preset or os.environ.get(PRESET_ENV) or default


def _cleaned(overrides: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for section, values in (overrides or {}).items():
        kept = {key: value for key, value in values.items() if value is not None}
        if kept:
            cleaned[section] = kept
    return cleaned


def config_with(
    overrides: dict[str, dict[str, Any]] | None = None, *, preset: str = DEFAULT_PRESET
) -> CodeQConfig:
    """Load the config (preset, file, env) and apply CLI flag overrides; None values are
    dropped. `preset` is the command's default preset (--preset and CODEQ_PRESET win)."""
    config = load_config(STATE.config_file, _cleaned(overrides), preset=chosen_preset(preset))
    if STATE.announce:
        STATE.announce = False
        print(f"settings: {settings_origin(preset)}, model {config.policy.model}", file=sys.stderr)
    return config


def settings_origin(preset: str = DEFAULT_PRESET) -> str:
    """Where the settings come from, for a command's first line."""
    if STATE.round_settings:
        return (
            f"those of {STATE.round_settings} ({STATE.config_file}; --preset or -c to use others)"
        )
    file = STATE.config_file or os.environ.get(CONFIG_FILE_ENV)
    shown = f"preset {chosen_preset(preset)}" + (f" + file {file}" if file else "")
    return f"{shown} (`codeq config --explain` shows every key)"


# ------------------------------------------------------------------------------ local rounds

_ROUND = re.compile(r"round-(\d+)")


def round_settings_of(path: Path) -> tuple[Path, str] | None:
    """The settings file of the local round that `path` lies in (its store folder
    OUT/store/runs/RUN/round-N/..., or its scratch folder OUT/work/RUN/round-N/...), and
    'round N of run RUN'; None outside a finished local round."""
    from codeq.pipeline.local_round import SETTINGS_NAME

    path = path.expanduser().resolve()
    for folder in (path, *path.parents):
        if not _ROUND.fullmatch(folder.name):
            continue
        run_dir = folder.parent
        candidates = [folder / SETTINGS_NAME]
        if run_dir.parent.name == "work":
            store_round = run_dir.parent.parent / "store" / "runs" / run_dir.name / folder.name
            candidates.append(store_round / SETTINGS_NAME)
        for candidate in candidates:
            if candidate.is_file():
                return (
                    candidate,
                    f"round {folder.name.removeprefix('round-')} of run {run_dir.name}",
                )
    return None


def use_round_settings(values: Iterable[Any]) -> None:
    """A stage command given a path inside a finished local round (its tasks, adapter, ...)
    runs with that round's settings, unless --config, --preset, CODEQ_CONFIG_FILE or
    CODEQ_PRESET chooses others."""
    if STATE.config_file or STATE.preset:
        return
    if os.environ.get(CONFIG_FILE_ENV) or os.environ.get(PRESET_ENV):
        return
    for value in values:
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if not isinstance(item, Path | str) or not str(item) or "://" in str(item):
                continue
            if not Path(item).expanduser().exists():
                continue
            found = round_settings_of(Path(item))
            if found is not None:
                STATE.config_file, STATE.round_settings = found
                return


def explain_with(
    overrides: dict[str, dict[str, Any]] | None = None, *, preset: str = DEFAULT_PRESET
) -> str:
    return explain_config(STATE.config_file, _cleaned(overrides), preset=chosen_preset(preset))


# ------------------------------------------------------------------------------ options


def preset_value(key: str, preset: str = DEFAULT_PRESET) -> Any:
    """The value of a dotted config key under a preset, without the user's file or env (for
    the defaults that --help shows)."""
    *sections, name = key.split(".")
    model = sub_model(CodeQConfig, tuple(sections))
    assert model is not None, key
    value = model.model_fields[name].get_default(call_default_factory=True)
    node: Any = read_yaml_mapping(PRESETS_DIR / f"{preset}.yaml")
    for section in sections:
        node = node.get(section) or {}
    return node.get(name, value)


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return "none" if value is None else str(value)


def key_option(
    key: str, *names: str, help: str, metavar: str, preset: str = DEFAULT_PRESET, **kwargs: Any
) -> Any:
    """An option that overrides config key `key`; --help shows the key's value as default."""
    shown = f"{key} = {_shown(preset_value(key, preset))}"
    return typer.Option(None, *names, help=help, metavar=metavar, show_default=shown, **kwargs)


def out_option(stage_folder: str, what: str) -> Any:
    """--out/-o: always a folder; default work_dir/<stage_folder>."""
    return typer.Option(
        None,
        "--out",
        "-o",
        help=f"Output folder for {what}.",
        metavar="DIR",
        show_default=f"work_dir/{stage_folder} = {preset_value('work_dir')}/{stage_folder}",
        file_okay=False,
    )


def out_dir(out: Path | None, config: CodeQConfig, stage_folder: str) -> Path:
    return out if out is not None else Path(config.work_dir) / stage_folder


MODEL_HELP = "Base model: Hugging Face id, model folder, .gguf file, or 'smollm2'."


def model_option(preset: str = DEFAULT_PRESET) -> Any:
    return key_option("policy.model", "--model", help=MODEL_HELP, metavar="MODEL", preset=preset)


def not_built_yet(stage: str, issue: str) -> StageFailedError:
    return StageFailedError(f"`codeq {stage}` is not built yet", hint=f"see the issue on {issue}")
