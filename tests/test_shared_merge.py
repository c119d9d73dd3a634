"""A merged policy made once per run and kept in the store (issue 36, item 1): the first pod
that needs a lineage merges it and uploads it under runs/<run>/merged/<name>; every later stage
or shard, with its own empty cache, downloads it (checked against its manifest) instead of
merging again. Each "pod" here is a StageContext with its own cache and scratch over one store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from codeq.config import CodeQConfig
from codeq.errors import CorruptInputError
from codeq.pipeline import policies
from codeq.pipeline.context import StageContext
from codeq.schemas import AdapterLink
from codeq.store import join_key, open_store
from codeq.train import lineage as lineage_module


@pytest.fixture
def merges(monkeypatch):
    """Every merge_adapters call, counted (and still carried out)."""
    calls: list[tuple] = []
    real_merge = lineage_module.merge_adapters

    def counted(*args, **kwargs):
        calls.append(args)
        return real_merge(*args, **kwargs)

    monkeypatch.setattr(lineage_module, "merge_adapters", counted)
    return calls


def pod(tmp_path: Path, name: str, tiny_model_dir: Path, keep_merged: bool = True) -> StageContext:
    config = CodeQConfig.model_validate(
        {
            "store": {
                "uri": f"file://{tmp_path / 'store'}",
                "run": "r",
                "round": 1,
                "keep_merged": keep_merged,
            },
            "policy": {
                "model": str(tiny_model_dir),
                "dtype": "float32",
                "cache_dir": str(tmp_path / name / "cache"),
            },
        }
    )
    return StageContext(config, open_store(config.store), tmp_path / name / "scratch")


def promoted(ctx: StageContext, tiny_adapter_dir: Path):
    """The lineage base + round 0's adapter, whose adapter lies in the store as train left it."""
    source = ctx.layout.of_round(0).stage("adapter")
    if not ctx.store.is_complete(source):
        ctx.store.put_dir(source, tiny_adapter_dir)
        ctx.store.mark_complete(source)
    link = AdapterLink(
        round=0, sha256=lineage_module.adapter_sha256(tiny_adapter_dir), source=source
    )
    return policies.base_policy(ctx).extended(link)


def weights_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.glob("*.safetensors")}


def test_the_first_pod_merges_and_keeps_it_and_the_next_downloads_it(
    tmp_path, tiny_model_dir, tiny_adapter_dir, merges
):
    first = pod(tmp_path, "first", tiny_model_dir)
    lineage = promoted(first, tiny_adapter_dir)
    made = Path(policies.policy_config(first, lineage).policy.model)
    assert len(merges) == 1
    prefix = first.layout.merged(made.name)
    assert first.store.is_complete(prefix)
    assert first.store.marker(prefix)["lineage"] == lineage.id

    second = pod(tmp_path, "second", tiny_model_dir)
    got = Path(policies.policy_config(second, promoted(second, tiny_adapter_dir)).policy.model)
    assert len(merges) == 1, "the second pod merged again instead of downloading"
    assert got != made and got.is_relative_to(tmp_path / "second" / "cache")
    assert weights_of(got) == weights_of(made) and weights_of(got)
    assert lineage_module.holds_merge(got, lineage)
    assert not got.with_name(got.name + ".download").exists()


def test_without_keep_merged_every_pod_merges_and_the_store_holds_none(
    tmp_path, tiny_model_dir, tiny_adapter_dir, merges
):
    for name in ("first", "second"):
        ctx = pod(tmp_path, name, tiny_model_dir, keep_merged=False)
        policies.policy_config(ctx, promoted(ctx, tiny_adapter_dir))
    assert len(merges) == 2
    assert not ctx.store.list(f"{ctx.layout.run_prefix}/merged")


def test_a_pod_merging_beside_a_fresh_claim_leaves_the_upload_to_its_claimant(
    tmp_path, tiny_model_dir, tiny_adapter_dir, merges
):
    """Two shards that start together both merge; only the claimant uploads. A claim older
    than STALE_CLAIM_S (its pod preempted before the marker) is taken over."""
    ctx = pod(tmp_path, "shard-1", tiny_model_dir)
    lineage = promoted(ctx, tiny_adapter_dir)
    name = lineage_module.merged_target(lineage, ctx.config.policy).name
    claim = join_key(ctx.layout.merged(name), policies.MERGE_CLAIM)
    ctx.store.put_json(claim, {"claimed_at": time.time(), "host": "shard-0"})
    policies.policy_config(ctx, lineage)
    assert len(merges) == 1 and not ctx.store.is_complete(ctx.layout.merged(name))

    ctx.store.put_json(claim, {"claimed_at": time.time() - policies.STALE_CLAIM_S - 1})
    later = pod(tmp_path, "shard-2", tiny_model_dir)
    policies.policy_config(later, lineage)
    assert len(merges) == 2 and later.store.is_complete(later.layout.merged(name))
    assert json.loads(later.store.get_bytes(claim))["round"] == 1


def test_a_changed_copy_in_the_store_is_refused_and_leaves_no_folder_that_looks_merged(
    tmp_path, tiny_model_dir, tiny_adapter_dir, merges
):
    first = pod(tmp_path, "first", tiny_model_dir)
    lineage = promoted(first, tiny_adapter_dir)
    made = Path(policies.policy_config(first, lineage).policy.model)
    prefix = first.layout.merged(made.name)
    (weights,) = [k for k in first.store.list(prefix) if k.endswith(".safetensors")]
    first.store.put_bytes(weights, first.store.get_bytes(weights)[:-8] + b"\0" * 8)

    second = pod(tmp_path, "second", tiny_model_dir)
    with pytest.raises(CorruptInputError, match="checksum"):
        policies.policy_config(second, promoted(second, tiny_adapter_dir))
    target = lineage_module.merged_target(lineage, second.config.policy)
    assert not lineage_module.holds_merge(target, lineage)
