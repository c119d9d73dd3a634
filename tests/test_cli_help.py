"""Every command's help, walked: the conventions of codeq/cli.py hold for all of them (help
flags, shown defaults, no type placeholders, one meaning per option name)."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import pytest
import typer

from codeq.cli import COMMANDS, app, run

GROUP = typer.main.get_command(app)


def options_of(name: str) -> list[Any]:
    command = GROUP.commands[name]  # type: ignore[attr-defined]
    return [p for p in command.params if p.param_type_name == "option"]


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_top_level_help(flag, capsys):
    assert run([flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: codeq ")
    for name in COMMANDS:
        assert re.search(rf"^  {name}\s", out, re.MULTILINE), name
    assert "--version" in out and "--preset" in out and "--config" in out


@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_every_command_help(name, flag, capsys):
    assert run([name, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: codeq {name} ")
    assert "<bool>" not in out, "flags take no value; help must not print one"
    assert "(default:" not in out, "defaults are shown as values, not as key names"
    assert "--config" in out and "--preset" in out
    assert "--help" in out and "-h" in out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_has_help_a_metavar_and_a_shown_default(name):
    for option in options_of(name):
        label = f"{name} {option.opts}"
        assert option.help, f"{label} has no help"
        if option.is_flag or option.name in {"help", "config_file", "preset"}:
            continue
        assert option.metavar, f"{label}: values need a metavar (DIR, N, FILE, ...)"
        if option.required or option.default is not None:
            continue
        # a None default means "decided later" (a config key's value, the next round): say what
        if option.name not in {"eval_results", "base_eval", "train", "pairs", "max_tasks"}:
            assert isinstance(option.show_default, str), f"{label} shows no default"
            if option.name not in {"round_number", "run"}:  # config --run names no key
                assert "=" in option.show_default, f"{label}: show 'key = value'"


def test_one_meaning_per_option_name():
    seen: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for name in COMMANDS:
        for option in options_of(name):
            for opt in option.opts:
                seen[opt].add((str(option.metavar), str(option.help)))
    for opt in ("--out", "--model", "--max-tasks", "--rollouts", "--round", "--run"):
        metavars = {metavar for metavar, _ in seen[opt]}
        assert len(metavars) == 1, f"{opt} takes different kinds of value: {metavars}"
    assert {metavar for metavar, _ in seen["--out"]} == {"DIR"}
    assert all(help.startswith("Output folder") for _, help in seen["--out"])
    assert len({help for _, help in seen["--model"]}) == 1


def test_stage_inputs_are_positional():
    """The main input of a stage is an argument; a --out option is its output folder."""
    for name in ("exec", "collect", "pairs", "train", "merge", "evaluate"):
        command = GROUP.commands[name]  # type: ignore[attr-defined]
        assert any(p.param_type_name == "argument" for p in command.params), name
