"""Where configuration values come from, and how to show it (`codeq config --explain`).

Layers, lowest first: the defaults in codeq/config.py < a preset (codeq/data/presets/NAME.yaml)
< the user's YAML file < CODEQ_* environment variables < CLI flags. Presets and the user's file
are merged key by key (a list is replaced, not appended to), so a file that sets one key keeps
every other key of the preset.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from codeq.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parent / "data" / "presets"
ENV_PREFIX = "CODEQ_"
NESTED = "__"
CONFIG_FILE_ENV = "CODEQ_CONFIG_FILE"
PRESET_ENV = "CODEQ_PRESET"
DEFAULT_PRESET = "production"  # the defaults of codeq/config.py (an empty file)

# CODEQ_* variables that are not config keys, and who reads them; any other CODEQ_* variable
# that names no config key is a typo and an error.
OTHER_VARIABLES = {
    CONFIG_FILE_ENV: "the YAML config file (like --config)",
    PRESET_ENV: "the preset (like --preset)",
    "CODEQ_SCRATCH_DIR": "jobs: the parent of each job's scratch folder",
    "CODEQ_FORCE": "jobs: replace a stage's earlier output (the workflow's force parameter)",
    "CODEQ_MODEL_REPOS": "the chart's model download job: repositories to fetch",
    "CODEQ_REGISTRY": "the images workflow: where images are pushed",
    "CODEQ_REQUIRE_DOCKER": "tests: .ci/run makes the image tests fail instead of skip",
    "CODEQ_KIND": "tests: set in the hosted kind workflow",
    "CODEQ_ARGO_SCHEMA": "tests: the Argo workflow schema",
    "CODEQ_DEBUGBENCH_DIR": "tests: the DebugBench clone",
    "CODEQ_TEST_CACHE": "tests: the model cache",
    "CODEQ_TEST_PARENT_SECRET": "tests: the sandbox's environment-secret attack",
    "CODEQ_BENCH_MODEL": "bench/train.py: the model to train",
}

KeyPath = tuple[str, ...]


# ------------------------------------------------------------------------------ presets


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        names = preset_names()
        raise ConfigError(
            f"unknown preset {name!r}",
            hint=f"{did_you_mean(name, names)}presets: {', '.join(names)}",
        )
    return path


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


# ------------------------------------------------------------------------------ YAML files


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML config file as a mapping; errors say where (line and column)."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}", hint="pass an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"config file {path} is not valid YAML{where}: {problem}",
            hint="check the indentation and the brackets/quotes around that position",
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of sections, not {type(data).__name__}",
            hint="e.g. 'search:' on one line, then '  rollouts: 16' below it",
        )
    return data


def key_position(path: Path, keys: KeyPath) -> str | None:
    """'line L, column C' of the (nested) key in a YAML file, if it is there."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    mark = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = [(k, v) for k, v in node.value if getattr(k, "value", None) == key]
        if not found:
            return None
        mark, node = found[0][0].start_mark, found[0][1]
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else None


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` over `base`, mappings merged key by key, everything else replaced."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# ------------------------------------------------------------------------------ layers


@dataclass
class Layers:
    """Every source of one configuration, except the defaults and the environment."""

    preset: str = DEFAULT_PRESET
    preset_values: dict[str, Any] = field(default_factory=dict)
    file: Path | None = None
    file_values: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, file: Path | None, preset: str, overrides: dict[str, Any] | None) -> Layers:
        layers = cls(preset=preset, file=file, overrides=dict(overrides or {}))
        layers.preset_values = read_yaml_mapping(preset_path(preset))
        if file is not None:
            layers.file_values = read_yaml_mapping(file)
        return layers

    def file_settings(self) -> dict[str, Any]:
        """Preset and file merged: the layer just below the environment."""
        return merge(self.preset_values, self.file_values)

    def layer_of(
        self, keys: KeyPath, environ: Mapping[str, str], model: type[BaseModel]
    ) -> tuple[str, Path | None]:
        """(origin, file) of the layer that sets `keys`: ('flag', None), ('env VAR', None),
        ('file PATH', PATH), ('preset NAME', its file) or ('default', None)."""
        if _has(self.overrides, keys):
            return "flag", None
        variable = env_variable_for(keys, environ, model)
        if variable:
            return f"env {variable}", None
        if self.file is not None and _has(self.file_values, keys):
            return f"file {self.file}", self.file
        if _has(self.preset_values, keys):
            return f"preset {self.preset}", preset_path(self.preset)
        return "default", None

    def origin(self, keys: KeyPath, environ: Mapping[str, str], model: type[BaseModel]) -> str:
        """Where the value of `keys` came from: flag, env VAR, file PATH, preset NAME, default."""
        return self.layer_of(keys, environ, model)[0]

    def position(self, keys: KeyPath, environ: Mapping[str, str], model: type[BaseModel]) -> str:
        """Where a bad key or value was set, for error messages ('' when it is unknown). A
        list item's location (search.modes.0) is its list's."""
        for depth in range(len(keys), 0, -1):
            origin, path = self.layer_of(keys[:depth], environ, model)
            if origin == "flag":
                return "from a command-line flag"
            if origin.startswith("env "):
                return f"from {origin.removeprefix('env ')}"
            if path is not None:
                spot = key_position(path, keys[:depth])
                return f"in {path}{', ' + spot if spot else ''}"
        return ""


def _has(values: Mapping[str, Any], keys: KeyPath) -> bool:
    node: Any = values
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


# ------------------------------------------------------------------------------ model walking


def sub_model(model: type[BaseModel], keys: KeyPath) -> type[BaseModel] | None:
    """The section model at `keys` (() is the top level), or None if `keys` is not a section."""
    for key in keys:
        info = model.model_fields.get(key)
        annotation = info.annotation if info else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def leaf_keys(model: type[BaseModel], prefix: KeyPath = ()) -> Iterator[KeyPath]:
    for name in model.model_fields:
        section = sub_model(model, (name,))
        if section is None:
            yield (*prefix, name)
        else:
            yield from leaf_keys(section, (*prefix, name))


def _env_name(keys: KeyPath) -> str:
    return ENV_PREFIX + NESTED.join(keys).upper()


def config_variables(model: type[BaseModel], prefix: KeyPath = ()) -> dict[str, KeyPath]:
    """Every CODEQ_* name that sets a key or a whole section (as JSON), upper case."""
    names: dict[str, KeyPath] = {}
    for name in model.model_fields:
        keys = (*prefix, name)
        names[_env_name(keys)] = keys
        section = sub_model(model, (name,))
        if section is not None:
            names.update(config_variables(section, keys))
    return names


def env_variable_for(keys: KeyPath, environ: Mapping[str, str], model: type[BaseModel]) -> str:
    """The CODEQ_* variable that sets `keys` (itself or a section above it, as JSON), or ''."""
    present = {name.upper(): name for name in environ}
    for depth in range(len(keys), 0, -1):
        name = _env_name(keys[:depth])
        if name in present:
            return present[name]
    return ""


def check_environment(model: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Unknown CODEQ_* variables are typos (pydantic-settings would silently ignore them)."""
    known = set(config_variables(model)) | set(OTHER_VARIABLES)
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in known
    )
    if not unknown:
        return
    first = unknown[0]
    more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
    raise ConfigError(
        f"unknown environment variable {first}{more}",
        hint=f"{did_you_mean(first.upper(), sorted(known))}CODEQ_SECTION__KEY sets a config key "
        "(e.g. CODEQ_SEARCH__ROLLOUTS); `codeq config --explain` lists the keys",
    )


# ------------------------------------------------------------------------------ explain


def explain(
    values: Mapping[str, Any],
    model: type[BaseModel],
    layers: Layers,
    environ: Mapping[str, str],
    width: int = 100,
) -> str:
    """The effective config as YAML with each key's help above it and its origin beside it."""
    sources = [f"preset {layers.preset}"]
    if layers.file:
        sources.append(f"file {layers.file}")
    lines = [
        f"# Effective configuration ({', '.join(sources)}). Layers, lowest first: default <",
        "# preset < file < env < flag; each key's origin is noted beside it.",
    ]
    lines.extend(_explain_section(values, model, (), layers, environ, width, model))
    return "\n".join(lines) + "\n"


def _explain_section(
    values: Mapping[str, Any],
    model: type[BaseModel],
    prefix: KeyPath,
    layers: Layers,
    environ: Mapping[str, str],
    width: int,
    root: type[BaseModel],
) -> list[str]:
    indent = "  " * len(prefix)
    lines: list[str] = []
    for name, info in model.model_fields.items():
        keys = (*prefix, name)
        section = sub_model(model, (name,))
        if section is not None:
            lines.extend(["", f"{indent}{name}:"])
            lines.extend(
                _explain_section(values[name], section, keys, layers, environ, width, root)
            )
            continue
        if info.description:
            lines.extend(
                textwrap.wrap(
                    info.description,
                    width=width,
                    initial_indent=f"{indent}# ",
                    subsequent_indent=f"{indent}# ",
                )
            )
        rendered = yaml.safe_dump({name: values[name]}, default_flow_style=True, width=10**6)
        rendered = rendered.strip().removeprefix("{").removesuffix("}")
        lines.append(f"{indent}{rendered}  # {layers.origin(keys, environ, root)}")
    return lines
