"""Experiment tracking (train.report_to): off by default, passed to TRL when set, and a missing
client is a configuration error before any model is loaded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from codeq.config import TrainConfig, load_config
from codeq.errors import ConfigError
from codeq.train.dpo import dpo_arguments, require_tracking_client, train_dpo


def test_tracking_is_off_by_default():
    assert TrainConfig().report_to == "none"
    assert dpo_arguments(TrainConfig(), Path("unused"), False, False).report_to == []


def test_report_to_reaches_trl_when_the_client_is_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    config = TrainConfig(report_to="mlflow")
    require_tracking_client(config.report_to)
    assert dpo_arguments(config, Path("unused"), False, False).report_to == ["mlflow"]


def test_an_unknown_tracker_is_rejected_by_the_config(monkeypatch):
    monkeypatch.setenv("CODEQ_TRAIN__REPORT_TO", "tensorboard")
    with pytest.raises(ConfigError):
        load_config(None)


@pytest.mark.parametrize("client", ["wandb", "mlflow"])
def test_a_missing_client_fails_before_training_starts(client, tmp_path, monkeypatch):
    if importlib.util.find_spec(client) is not None:
        pytest.skip(f"{client} is installed here")
    monkeypatch.setenv("CODEQ_TRAIN__REPORT_TO", client)
    config = load_config(None)
    with pytest.raises(ConfigError, match=f"{client!r} package is not installed") as caught:
        train_dpo(tmp_path / "no-pairs.jsonl", tmp_path / "out", config)
    assert caught.value.exit_code == 2
