"""State shared by commands: the global --config file, and config loading with overrides."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, load_config
from codeq.errors import StageFailedError


@dataclass
class CliState:
    config_file: Path | None = None


STATE = CliState()


def config_with(overrides: dict[str, dict[str, Any]] | None = None) -> CodeQConfig:
    """Load the config (file, env) and apply CLI flag overrides; None values are dropped."""
    cleaned: dict[str, Any] = {}
    for section, values in (overrides or {}).items():
        kept = {key: value for key, value in values.items() if value is not None}
        if kept:
            cleaned[section] = kept
    return load_config(STATE.config_file, cleaned)


def not_built_yet(stage: str, issue: str) -> StageFailedError:
    return StageFailedError(f"`codeq {stage}` is not built yet", hint=f"see the issue on {issue}")
