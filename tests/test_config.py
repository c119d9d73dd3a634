"""Config: defaults, YAML, environment precedence, and one clear error for bad keys/values."""

from __future__ import annotations

import pytest

from codeq.config import LORA_TARGET_MODULES, dump_config, load_config
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
        ("search: [\n", "not valid YAML"),
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


def test_unknown_environment_key_is_an_error(monkeypatch):
    monkeypatch.setenv("CODEQ_SEARCH__ROLOUTS", "3")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config()


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")


def test_dump_round_trips(tmp_path):
    config = load_config(None, {"search": {"rollouts": 3}})
    path = tmp_path / "dumped.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config
