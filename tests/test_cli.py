"""The CLI lists every stage, and turns bad input into one `error:` line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import yaml

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
        # the timeout only catches a hang: on a loaded machine the imports alone took 3 minutes
        [sys.executable, "-m", "codeq", "--help"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0
    assert "collect" in result.stdout


def test_bad_config_key_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search:\n  rolouts: 4\n")
    assert run(["--config", str(bad), "config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[0] == f"error: invalid config: search.rolouts: unknown key in {bad}, line 2, column 3"
    )
    assert err[1].startswith("hint: did you mean rollouts?")
    assert len(err) == 2


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


def test_usage_errors_point_at_the_command_help(capsys):
    assert run(["train"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: Missing argument 'PAIRS'.", "hint: run `codeq train --help` for usage"]


def test_version(capsys):
    from codeq import __version__

    assert run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"codeq {__version__}"


def test_config_shows_a_preset_and_a_file_layered_on_it(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text("search:\n  rollouts: 2\n")
    for argv in (
        ["-c", str(mine), "config", "--preset", "laptop"],
        ["--preset", "laptop", "config", "-c", str(mine)],
    ):
        assert run(argv) == 0
        config = yaml.safe_load(capsys.readouterr().out)
        assert config["search"]["rollouts"] == 2 and config["policy"]["model"] == "smollm2"
    assert run(["config", "--explain", "--preset", "laptop", "-c", str(mine)]) == 0
    out = capsys.readouterr().out
    assert f"  rollouts: 2  # file {mine}" in out and "  model: smollm2  # preset laptop" in out


def test_misspelt_environment_section_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("CODEQ_SERCH__ROLLOUTS", "16")
    assert run(["config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: unknown environment variable CODEQ_SERCH__ROLLOUTS",
        err[1],
    ] and err[1].startswith("hint: did you mean CODEQ_SEARCH__ROLLOUTS?")


def test_yaml_syntax_error_names_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("search:\n  rollouts: 3\n   mode: bon\n")
    assert run(["-c", str(bad), "config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: config file {bad} is not valid YAML at line 3, column ")
    assert err[1].startswith("hint: ") and len(err) == 2


def test_round_keeps_its_laptop_preset_under_a_user_file(tmp_path, monkeypatch, capsys):
    """`codeq -c mine.yaml round`: the file changes one key; the rest stays the laptop preset
    (it used to bring back the production defaults). Only the config the command builds is
    checked here; tests/test_round.py runs real rounds."""
    from codeq.config_layers import PRESETS_DIR
    from codeq.pipeline import local_round

    laptop = yaml.safe_load((PRESETS_DIR / "laptop.yaml").read_text())
    seen = []

    def capture(config, out, *, source=None, engines=None, force=False, progress=None):
        seen.append(config)
        return {"round": 0, "seconds": 0.0, "results": {}, "report": str(out / "report")}

    monkeypatch.setattr(local_round, "run_round", capture)
    mine = tmp_path / "mine.yaml"
    mine.write_text("search:\n  rollouts: 2\n")
    for argv in (["-c", str(mine), "round"], ["round", "-c", str(mine)]):
        assert run([*argv, "-o", str(tmp_path / "run")]) == 0
        config = seen.pop()
        assert config.search.rollouts == 2
        assert config.policy.model == laptop["policy"]["model"]
        assert config.train.max_steps == laptop["train"]["max_steps"]
        assert config.evaluate.modes == laptop["evaluate"]["modes"]
        assert f"preset laptop + file {mine}" in capsys.readouterr().err
    assert run(["round", "--preset", "production", "-o", str(tmp_path / "run")]) == 0
    assert seen.pop().policy.model == "Qwen/Qwen2.5-Coder-7B-Instruct"


def test_stage_commands_inside_a_local_round_use_its_settings_and_say_so(
    tmp_path, monkeypatch, capsys
):
    """After `codeq round`, README's next commands point at the round's folders: they run with
    the round's settings (not the production preset, which loads the 7B model), say so on their
    first line, and `codeq config --run` shows those settings."""
    from codeq.pipeline import stages

    def finished(context, **arguments):
        context.store.mark_complete(context.layout.stage("promote"), {"promote": False})
        return {"skipped": False}

    for name in stages.STAGE_FUNCTIONS:
        monkeypatch.setitem(stages.STAGE_FUNCTIONS, name, finished)
    out = tmp_path / "run"
    assert run(["round", "-o", str(out), "--max-items", "3"]) == 0
    round_dir = out / "store" / "runs" / "local" / "round-0"
    settings = round_dir / "settings.yaml"
    assert yaml.safe_load(settings.read_text())["tasks"]["max_items"] == 3
    empty = round_dir / "trajectories" / "shard-0" / "trajectories.jsonl"
    empty.parent.mkdir(parents=True)
    empty.write_text("")
    capsys.readouterr()

    assert run(["pairs", str(empty), "-o", str(tmp_path / "pairs")]) != 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        f"settings: those of round 0 of run local ({settings}; --preset or -c to use others), "
        "model smollm2"
    )
    assert run(["--preset", "production", "pairs", str(empty), "-o", str(tmp_path / "p")]) != 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "settings: preset production (`codeq config --explain` shows every key), "
        "model Qwen/Qwen2.5-Coder-7B-Instruct"
    )

    assert run(["config", "--run", "local", "-o", str(out), "--explain"]) == 0
    explained = capsys.readouterr().out
    assert f"  model: smollm2  # file {settings}" in explained
    assert f"  max_items: 3  # file {settings}" in explained
    assert run(["config", "--run", "other", "-o", str(out)]) == 2
    assert "run 'other' has no finished round" in capsys.readouterr().err
