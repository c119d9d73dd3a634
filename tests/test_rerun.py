"""Reruns against outputs an earlier run made: a stage skips an output made under the same
fingerprint (its config keys and its inputs' manifests), refuses one made under another with the
changed keys in one line, and, forced, replaces it (marker first, marker last) so the next stage
reads the new output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_pairs import node, trajectory

from codeq.config import StoreConfig, load_config
from codeq.errors import EXIT_BAD_INPUT
from codeq.pipeline.fingerprint import STAGE_KEYS, StaleOutputError, stage_config
from codeq.pipeline.stages import StageContext, pairs_stage, train_stage
from codeq.schemas import Lineage, Pair, read_jsonl, write_jsonl
from codeq.store import MARKER_NAME, RoundLayout, join_key, open_store

REPO = Path(__file__).resolve().parent.parent
LAYOUT = RoundLayout("default", 0)
POLICY = Lineage(base_model="smollm2", base_sha256="a" * 64)


def store_with_a_shard(tmp_path: Path):
    """A store whose round 0 has one complete collect shard: two tasks, sibling value gaps
    1.0 and 0.3."""
    store = open_store(StoreConfig(uri=f"file://{tmp_path / 'store'}"))
    wide = [node(0, None, "", 0.0), node(1, 0, "good", 1.0), node(2, 0, "bad", 0.0)]
    narrow = [node(0, None, "", 0.0), node(1, 0, "better", 0.6), node(2, 0, "worse", 0.3)]
    trees = [
        trajectory(wide, task_id="t1").model_copy(update={"policy": POLICY}),
        trajectory(narrow, task_id="t2").model_copy(update={"policy": POLICY}),
    ]
    folder = tmp_path / "shard"
    write_jsonl(folder / "trajectories.jsonl", trees)
    store.put_dir(LAYOUT.shard(0), folder)
    store.mark_complete(LAYOUT.shard(0), {"shard_index": 0, "shard_count": 1})
    return store


def context(store, tmp_path: Path, force: bool = False, **settings) -> StageContext:
    config = load_config(overrides={"store": {"uri": store.uri}, **settings})
    return StageContext(config=config, store=store, scratch=tmp_path / "scratch", force=force)


def gap(value: float) -> dict:
    return {"pairs": {"alpha": 1.0, "min_value_gap": value}}


def pair_count(store, tmp_path: Path) -> int:
    target = tmp_path / "check" / "pairs.jsonl"
    store.get_verified_file(LAYOUT.stage("pairs"), "pairs.jsonl", target)
    return len(read_jsonl(target, Pair))


def test_unchanged_rerun_skips_changed_config_is_refused_and_force_replaces(tmp_path):
    store = store_with_a_shard(tmp_path)
    first = pairs_stage(context(store, tmp_path, **gap(0.1)))
    assert first["pairs"] == 2 and not first["skipped"]
    marker = store.marker(LAYOUT.stage("pairs"))
    assert marker["fingerprint"]["config"]["pairs.min_value_gap"] == 0.1
    assert marker["seconds"] >= 0  # the stage's wall time, for the report

    again = pairs_stage(context(store, tmp_path, **gap(0.1)))
    assert again["skipped"]

    with pytest.raises(StaleOutputError) as refused:
        pairs_stage(context(store, tmp_path, **gap(0.5)))
    message = str(refused.value)
    assert "pairs.min_value_gap 0.1 -> 0.5" in message and "\n" not in message
    assert "--force" in (refused.value.hint or "") and refused.value.exit_code == EXIT_BAD_INPUT
    assert pair_count(store, tmp_path) == 2  # the refused rerun left the output alone

    forced = pairs_stage(context(store, tmp_path, force=True, **gap(0.5)))
    assert forced["pairs"] == 1 and not forced["skipped"]
    assert pair_count(store, tmp_path) == 1
    assert (
        store.marker(LAYOUT.stage("pairs"))["fingerprint"]["config"]["pairs.min_value_gap"] == 0.5
    )
    assert pairs_stage(context(store, tmp_path, **gap(0.5)))["skipped"]


def test_recomputed_pairs_make_the_train_stage_refuse_until_forced(tmp_path):
    store = store_with_a_shard(tmp_path)
    pairs_stage(context(store, tmp_path, **gap(1.0)))  # no pair: train needs no model
    trained = train_stage(context(store, tmp_path, **gap(1.0)))
    assert trained["trained"] is False
    assert train_stage(context(store, tmp_path, **gap(1.0)))["skipped"]
    # collect redone with a third task, then pairs forced: still no pair, but other pairs output
    store.unmark_complete(LAYOUT.shard(0))
    extra = trajectory([node(0, None, "", 0.0)], task_id="t3").model_copy(update={"policy": POLICY})
    write_jsonl(tmp_path / "shard" / "trajectories.jsonl", [extra], append=True)
    store.put_dir(LAYOUT.shard(0), tmp_path / "shard")
    store.mark_complete(LAYOUT.shard(0), {"shard_index": 0, "shard_count": 1})
    with pytest.raises(StaleOutputError, match="input collect shard 0 changed"):
        pairs_stage(context(store, tmp_path, **gap(1.0)))
    assert pairs_stage(context(store, tmp_path, force=True, **gap(1.0)))["trajectories"] == 3
    with pytest.raises(StaleOutputError, match="input pairs changed") as refused:
        train_stage(context(store, tmp_path, **gap(1.0)))
    assert "pairs.min_value_gap" not in str(refused.value)  # not a train key
    again = train_stage(context(store, tmp_path, force=True, **gap(1.0)))
    assert again["trained"] is False and not again["skipped"]
    assert train_stage(context(store, tmp_path, **gap(1.0)))["skipped"]


def test_a_changed_train_key_names_old_and_new_value(tmp_path):
    store = store_with_a_shard(tmp_path)
    pairs_stage(context(store, tmp_path, **gap(1.0)))
    train_stage(context(store, tmp_path, train={"learning_rate": 5e-6}))
    with pytest.raises(StaleOutputError, match=r"train.learning_rate 5e-06 -> 0.0001"):
        train_stage(context(store, tmp_path, train={"learning_rate": 1e-4}))
    # Keys that only change speed or where files go are not part of the fingerprint.
    speed = {"learning_rate": 5e-6, "gradient_checkpointing": True}
    assert train_stage(context(store, tmp_path, train=speed))["skipped"]
    elsewhere = str(tmp_path / "elsewhere")
    assert train_stage(context(store, tmp_path, work_dir=elsewhere, train=speed))["skipped"]


def test_a_forced_stage_is_unmarked_before_its_files_are_replaced(tmp_path, monkeypatch):
    """No reader may see a half-replaced output as complete: the marker goes first, the files
    of the old output go with it, and the new marker is written last."""
    store = store_with_a_shard(tmp_path)
    pairs_stage(context(store, tmp_path, **gap(0.1)))
    prefix = LAYOUT.stage("pairs")
    store.put_bytes(join_key(prefix, "stale-extra.json"), b"{}")  # a file no manifest lists
    seen: list[tuple[str, bool]] = []
    put_file = type(store).put_file

    def watching_put_file(self, key, path):
        seen.append((key, self.exists(join_key(prefix, MARKER_NAME))))
        put_file(self, key, path)

    monkeypatch.setattr(type(store), "put_file", watching_put_file)
    pairs_stage(context(store, tmp_path, force=True, **gap(0.5)))
    writes = [complete for key, complete in seen if key.startswith(prefix)]
    assert writes and not any(writes)
    assert not store.exists(join_key(prefix, "stale-extra.json"))
    assert store.is_complete(prefix)


@pytest.mark.parametrize(
    ("key", "neutral_value", "other"),
    [("widening", 0.0, 0.5), ("refine", "multi_turn", "one_turn")],
)
def test_a_later_key_at_its_neutral_value_leaves_earlier_fingerprints_unchanged(
    key, neutral_value, other
):
    """search.widening and search.refine came after runs existed: at what those runs did the
    collect and evaluate fingerprints are the ones they recorded, so they resume; at another
    value the stage is stale and the change is named."""
    neutral = load_config(overrides={"search": {"widening": 0.0, key: neutral_value}})
    changed = load_config(overrides={"search": {"widening": 0.0, key: other}})
    for stage in ("collect", "evaluate"):
        assert f"search.{key}" not in stage_config(neutral, stage)
        assert stage_config(changed, stage)[f"search.{key}"] == other
        earlier = {k: v for k, v in stage_config(changed, stage).items() if k != f"search.{key}"}
        assert stage_config(neutral, stage) == earlier


def test_every_stage_key_names_a_config_key():
    config = load_config()
    for stage in STAGE_KEYS:
        values = stage_config(config, stage)
        assert all("." in key for key in values), stage
    assert "store.uri" not in stage_config(config, "collect")
    assert not any(key.startswith("store.") for stage in STAGE_KEYS for key in STAGE_KEYS[stage])


def test_a_job_refuses_a_stale_output_in_one_line_and_codeq_force_replaces_it(tmp_path):
    store = store_with_a_shard(tmp_path)
    pairs_stage(context(store, tmp_path, **gap(0.1)))
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "CODEQ_STORE__URI": store.uri,
        "CODEQ_PAIRS__MIN_VALUE_GAP": "0.5",
        "CODEQ_PAIRS__ALPHA": "1.0",
    }
    command = [sys.executable, "-m", "jobs.pairs"]
    refused = subprocess.run(
        command, env=env, capture_output=True, text=True, cwd=REPO, timeout=300
    )
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr[-2000:]
    assert len(errors) == 1 and "pairs.min_value_gap 0.1 -> 0.5" in errors[0]
    forced = subprocess.run(
        command,
        env={**env, "CODEQ_FORCE": "1"},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert json.loads(store.get_bytes(join_key(LAYOUT.stage("pairs"), MARKER_NAME)))["pairs"] == 1


def test_a_train_checkpoint_is_resumed_only_under_the_fingerprint_it_was_made_under(tmp_path):
    """A stopped train stage left a checkpoint in the store: the rerun resumes from it under
    the same config, refuses it under another (naming the key), and forced, discards it."""
    from codeq.pipeline.context import begin, restore_checkpoint
    from codeq.pipeline.stages import TRAIN_PROGRESS
    from codeq.train.checkpoints import CheckpointTarget, upload_checkpoint

    store = store_with_a_shard(tmp_path)
    pairs_stage(context(store, tmp_path, **gap(0.1)))
    prefix = LAYOUT.stage(TRAIN_PROGRESS)

    def train_run(ctx):
        return begin(ctx, LAYOUT.stage("adapter"), "train", inputs={"pairs": LAYOUT.stage("pairs")})

    made = context(store, tmp_path, train={"learning_rate": 5e-6})
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "trainer_state.json").write_text('{"global_step": 7}')
    target = CheckpointTarget(made.config.store, prefix, train_run(made).fingerprint.to_json())
    upload_checkpoint(target, folder, 7)

    resumed = restore_checkpoint(made, train_run(made), prefix)
    assert resumed is not None and resumed.name == "checkpoint-7"
    assert (resumed / "trainer_state.json").read_text() == '{"global_step": 7}'
    other = context(store, tmp_path, train={"learning_rate": 1e-4})
    with pytest.raises(StaleOutputError, match=r"train.learning_rate 5e-06 -> 0.0001"):
        restore_checkpoint(other, train_run(other), prefix)
    forced = context(store, tmp_path, force=True, train={"learning_rate": 1e-4})
    assert restore_checkpoint(forced, train_run(forced), prefix) is None
    assert store.list(prefix) == []
