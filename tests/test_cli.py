"""The CLI lists every stage, and turns bad input into one `error:` line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

from codeq.cli import COMMANDS, run

STAGES = ["prepare", "collect", "pairs", "train", "merge", "evaluate", "promote", "report", "round"]


def test_help_lists_the_stages(capsys):
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    for stage in STAGES + ["exec", "config"]:
        assert stage in out
    assert set(STAGES) <= set(COMMANDS)


def test_console_script_runs():
    result = subprocess.run(
        [sys.executable, "-m", "codeq", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "collect" in result.stdout


def test_bad_config_key_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search:\n  rolouts: 4\n")
    assert run(["--config", str(bad), "config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "error: invalid config: search.rolouts: unknown key"
    assert err[1].startswith("hint: ")


def test_bad_config_value_from_env_is_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("CODEQ_SEARCH__TEMPERATURE", "hot")
    assert run(["config"]) == 2
    assert capsys.readouterr().err.startswith("error: invalid config: search.temperature")


def test_config_prints_effective_yaml(monkeypatch, capsys):
    monkeypatch.setenv("CODEQ_SEARCH__ROLLOUTS", "11")
    assert run(["config"]) == 0
    assert "rollouts: 11" in capsys.readouterr().out


def test_unknown_command_is_usage_error(capsys):
    assert run(["no-such-stage"]) == 2
    assert capsys.readouterr().err.startswith("error: ")
