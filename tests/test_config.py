"""Config: defaults, presets, YAML, environment precedence, `--explain`, and one clear error
for bad keys/values/variables."""

from __future__ import annotations

import pytest
import yaml

from codeq.config import LORA_TARGET_MODULES, dump_config, explain_config, load_config
from codeq.config_layers import OTHER_VARIABLES, PRESETS_DIR
from codeq.errors import EXIT_BAD_INPUT, ConfigError


def test_defaults_follow_codeq():
    config = load_config()
    assert 2 <= config.search.rewrites_per_expansion <= 4
    assert config.search.temperature == 0.8
    assert config.policy.critique_temperature == 0.2
    assert (config.train.lora_r, config.train.lora_alpha) == (32, 64)
    assert config.train.target_modules == LORA_TARGET_MODULES
    assert config.train.beta == 0.1
    assert config.train.per_device_batch_size * config.train.gradient_accumulation_steps == 16
    assert config.tasks.seed == 42 and config.tasks.test_fraction == 0.15


def test_yaml_file_then_env_then_overrides(tmp_path, monkeypatch):
    path = tmp_path / "codeq.yaml"
    path.write_text("search:\n  rollouts: 5\n  temperature: 0.6\ntasks:\n  seed: 1\n")
    monkeypatch.setenv("CODEQ_SEARCH__TEMPERATURE", "0.7")
    config = load_config(path, {"tasks": {"seed": 9}})
    assert config.search.rollouts == 5  # from the file
    assert config.search.temperature == 0.7  # env beats file
    assert config.tasks.seed == 9  # overrides beat everything


def test_config_file_from_environment(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("pairs:\n  alpha: 0.25\n")
    monkeypatch.setenv("CODEQ_CONFIG_FILE", str(path))
    assert load_config().pairs.alpha == 0.25


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("search:\n  rolouts: 5\n", "search.rolouts: unknown key"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("search:\n  temperature: 5\n", "search.temperature"),
        ("sandbox:\n  backend: docker\n", "sandbox.backend"),
        ("- a\n- b\n", "must hold a mapping"),
        ("search: [\n", "not valid YAML at line 2, column 1"),
        ("search:\n  rollouts: 3\n mode: bon\n", "not valid YAML at line 3, column 2"),
    ],
)
def test_bad_yaml_gives_one_line_config_error(tmp_path, yaml_text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("CODEQ_SEARCH__ROLOUTS", "CODEQ_SEARCH__ROLLOUTS"),
        ("CODEQ_SERCH__ROLLOUTS", "CODEQ_SEARCH__ROLLOUTS"),  # a misspelt section
        ("CODEQ_WORKDIR", "CODEQ_WORK_DIR"),
        ("CODEQ_CONFIG_FIEL", "CODEQ_CONFIG_FILE"),
    ],
)
def test_unknown_environment_variable_is_an_error_with_a_suggestion(monkeypatch, name, suggestion):
    monkeypatch.setenv(name, "3")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert str(info.value) == f"unknown environment variable {name}"
    assert info.value.hint is not None and f"did you mean {suggestion}?" in info.value.hint


def test_variables_that_are_not_config_keys_are_allowed(monkeypatch, tmp_path):
    for name in OTHER_VARIABLES:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("CODEQ_CONFIG_FILE", str(tmp_path / "c.yaml"))
    (tmp_path / "c.yaml").write_text("search:\n  rollouts: 2\n")
    monkeypatch.setenv("CODEQ_PRESET", "laptop")
    monkeypatch.setenv("codeq_search__temperature", "0.5")  # case-insensitive, as pydantic reads
    monkeypatch.setenv("CODEQ_EVALUATE", '{"max_tasks": 3}')  # a whole section as JSON
    config = load_config()
    assert (config.search.rollouts, config.search.temperature) == (2, 0.5)
    assert config.evaluate.max_tasks == 3


def test_every_codeq_variable_the_chart_images_and_ci_set_is_known():
    import re
    from pathlib import Path

    from codeq.config import CodeQConfig
    from codeq.config_layers import config_variables

    repo = Path(__file__).resolve().parent.parent
    places = ["helm/codeq/templates/*", "helm/codeq/files/*", "Dockerfile.*", "images/*"]
    places += [".ci/run", ".github/workflows/*", "Makefile"]
    used: set[str] = set()
    for path in (p for place in places for p in repo.glob(place) if p.is_file()):
        used |= set(re.findall(r"\bCODEQ_[A-Z0-9_]+", path.read_text(errors="replace")))
    assert {"CODEQ_STORE__URI", "CODEQ_REQUIRE_DOCKER"} <= used
    assert used <= set(config_variables(CodeQConfig)) | set(OTHER_VARIABLES)


def test_bad_value_says_which_file_and_line(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("tasks:\n  seed: 1\nsearch:\n  rolouts: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"invalid config: search.rolouts: unknown key in {path}, line 4, column 3"
    )
    assert info.value.hint is not None and "did you mean rollouts?" in info.value.hint
    path.write_text("evaluate:\n  modes: [full_rewrite, bogus]\n")
    with pytest.raises(ConfigError, match=rf"evaluate\.modes\.1: .* in {path}, line 2, column 3"):
        load_config(path)
    with pytest.raises(ConfigError, match="from a command-line flag"):
        load_config(None, {"evaluate": {"modes": ["bogus"]}})


# ------------------------------------------------------------------------------ presets


def test_production_preset_is_the_defaults_and_laptop_differs():
    assert load_config(preset="production") == load_config()
    laptop = load_config(preset="laptop")
    assert laptop.policy.model == "smollm2"
    assert laptop.search.rollouts == 1 and laptop.evaluate.modes == ["full_rewrite"]


def test_preset_survives_a_user_file_that_sets_one_key(tmp_path, monkeypatch):
    """`codeq -c mine.yaml round`: one key from the file, everything else from the preset."""
    path = tmp_path / "mine.yaml"
    path.write_text("search:\n  rollouts: 2\n")
    config = load_config(path, preset="laptop")
    laptop = yaml.safe_load((PRESETS_DIR / "laptop.yaml").read_text())
    assert config.search.rollouts == 2  # the file
    assert config.search.rewrites_per_expansion == laptop["search"]["rewrites_per_expansion"]
    assert (
        config.policy.model == "smollm2" and config.train.max_steps == laptop["train"]["max_steps"]
    )
    monkeypatch.setenv("CODEQ_SEARCH__ROLLOUTS", "3")
    assert load_config(path, preset="laptop").search.rollouts == 3  # env over the file
    assert load_config(path, {"search": {"rollouts": 4}}, preset="laptop").search.rollouts == 4


def test_preset_from_the_environment_and_unknown_presets(monkeypatch):
    monkeypatch.setenv("CODEQ_PRESET", "laptop")
    assert load_config().policy.model == "smollm2"
    assert load_config(preset="production").policy.model != "smollm2"  # explicit wins
    with pytest.raises(ConfigError, match="unknown preset 'laptp'") as info:
        load_config(preset="laptp")
    assert info.value.hint is not None and "did you mean laptop?" in info.value.hint


def test_explain_gives_help_and_origin_of_every_key(tmp_path, monkeypatch):
    path = tmp_path / "mine.yaml"
    path.write_text("search:\n  rollouts: 2\n")
    monkeypatch.setenv("CODEQ_SEARCH__TEMPERATURE", "0.5")
    text = explain_config(path, {"tasks": {"seed": 7}}, preset="laptop")
    lines = text.splitlines()
    assert "  rollouts: 2  # file " + str(path) in lines
    assert "  temperature: 0.5  # env CODEQ_SEARCH__TEMPERATURE" in lines
    assert "  seed: 7  # flag" in lines
    assert "  model: smollm2  # preset laptop" in lines
    assert "  exploration: 1.0  # default" in lines
    assert "  # UCB1 exploration constant c." in lines
    # the explained output is itself a config file that loads to the same values
    explained = tmp_path / "explained.yaml"
    explained.write_text(text)
    monkeypatch.delenv("CODEQ_SEARCH__TEMPERATURE")
    expected = load_config(
        path, {"tasks": {"seed": 7}, "search": {"temperature": 0.5}}, preset="laptop"
    )
    assert load_config(explained) == expected


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")


def test_dump_round_trips(tmp_path):
    config = load_config(None, {"search": {"rollouts": 3}})
    path = tmp_path / "dumped.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_a_config_as_another_round_changes_where_it_lives_and_nothing_else():
    config = load_config(
        None, {"store": {"run": "lr-sweep", "round": 2}, "search": {"rollouts": 3}}
    )
    later = config.as_round(5)
    other = config.as_round(0, run="baseline")
    assert (later.store.run, later.store.round) == ("lr-sweep", 5)
    assert (other.store.run, other.store.round) == ("baseline", 0)
    assert later.model_dump(exclude={"store"}) == config.model_dump(exclude={"store"})
    assert later.store.model_dump(exclude={"round"}) == config.store.model_dump(exclude={"round"})
    assert config.store.round == 2  # the original is left as it was
