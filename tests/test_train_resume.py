"""A stopped DPO run resumes from its last checkpoint in the store and ends where an
uninterrupted run ends: the same adapter, step losses, held-out choice and padding counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from codeq.config import StoreConfig
from codeq.schemas import write_jsonl
from codeq.store import FileStore
from codeq.train.checkpoints import CheckpointTarget, download_latest, latest
from tests.preemption import preempted_after_checkpoint
from tests.test_train import make_pairs, tiny_config


def resume_config(model_dir: Path, every_s: float):
    return tiny_config(
        model_dir,
        max_steps=4,
        eval_steps=2,
        precision="fp32",
        checkpoint_every_s=every_s,
    )


def adapter_weights(out_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out_dir / "adapter" / "adapter_model.safetensors")


def test_a_stopped_run_resumes_from_the_store_and_matches_an_uninterrupted_one(
    tmp_path, tiny_model_dir, monkeypatch
) -> None:
    import torch

    import codeq.train.dpo as dpo
    from codeq.train import train_dpo

    pairs_path = tmp_path / "pairs.jsonl"
    write_jsonl(pairs_path, make_pairs(20, tasks=5))
    config = resume_config(tiny_model_dir, every_s=1e-9)  # a checkpoint after every step
    store_root = tmp_path / "store"
    target = CheckpointTarget(StoreConfig(uri=f"file://{store_root}"), "run/train-progress", {})

    # the uninterrupted run keeps no checkpoints (0 turns them off), and trains the same
    unchecked = resume_config(tiny_model_dir, every_s=0)
    whole = train_dpo(pairs_path, tmp_path / "whole", unchecked, checkpoints=target)
    assert latest(FileStore(store_root), "run/train-progress") is None
    assert not list((tmp_path / "whole" / "checkpoints").glob("checkpoint-*"))

    with preempted_after_checkpoint(monkeypatch, dpo, step=2):
        train_dpo(pairs_path, tmp_path / "stopped", config, checkpoints=target)

    store = FileStore(store_root)
    assert latest(store, "run/train-progress")["step"] == 2
    kept = {key.split("/")[2] for key in store.list("run/train-progress") if "checkpoint-" in key}
    assert kept == {"checkpoint-2"}  # older ones are dropped once LATEST names a newer one
    checkpoint = download_latest(store, "run/train-progress", tmp_path / "downloaded")
    resumed = train_dpo(
        pairs_path, tmp_path / "resumed", config, checkpoints=target, resume_from=checkpoint
    )

    assert resumed["resumed_from_step"] == 2 and whole["resumed_from_step"] is None
    assert resumed["global_steps"] == whole["global_steps"] == 4
    assert [s["loss"] for s in resumed["steps"]] == pytest.approx(
        [s["loss"] for s in whole["steps"]], rel=1e-5
    )
    assert resumed["best_step"] == whole["best_step"]
    assert resumed["heldout_reward_accuracy"] == whole["heldout_reward_accuracy"]
    assert resumed["tokens"]["real"] == whole["tokens"]["real"]
    assert resumed["tokens"]["padded"] == whole["tokens"]["padded"]
    assert len(resumed["step_seconds"]) == 4
    expected, got = adapter_weights(tmp_path / "whole"), adapter_weights(tmp_path / "resumed")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.allclose(expected[name], got[name], atol=1e-6), name
    assert not (tmp_path / "stopped" / "adapter").exists()  # the stopped run wrote no adapter
    assert not (tmp_path / "resumed" / "checkpoints").exists()  # spent once the adapter is written
