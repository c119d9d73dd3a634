"""Two chained local rounds with the real SmolLM2-135M: round 1 samples from the policy round 0
promoted (recorded lineage; logits that differ from the base) and trains on it as DPO's reference,
on its own pairs and, replayed, round 0's (train.earlier_rounds), and its evaluation reuses the
trees round 0 searched for that policy; a round whose predecessor has not finished is refused."""

from __future__ import annotations

import json

import pytest

import codeq.search
from codeq.config import load_config
from codeq.errors import RoundOrderError
from codeq.pipeline.local_round import LOCAL_ROUND_PRESET, run_round
from codeq.pipeline.policies import current_policy, set_current
from codeq.pipeline.stages import StageContext
from codeq.promotion import PromotionDecision
from codeq.schemas import Lineage, Pair, Task, Trajectory, read_jsonl
from codeq.store import RoundLayout, open_store
from codeq.train.lineage import merged_key

SETTINGS = {
    "tasks": {"max_items": 12},
    "policy": {
        "max_new_tokens": 48,
        "critique_max_new_tokens": 8,
        "dtype": "float32",  # merged weights keep the adapter's small updates exactly
    },
    "search": {"rollouts": 1, "rewrites_per_expansion": 2, "max_depth": 1},
    "pairs": {"min_value_gap": 0.0},
    "train": {
        "max_steps": 2,
        "lora_r": 4,
        "lora_alpha": 8,
        "per_device_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1e-3,
        "eval_fraction": 0.0,
        "precision": "fp32",
        "max_length": 1024,
        "earlier_rounds": 1,  # round 1 replays round 0's pairs, which the base model wrote
    },
    "verifier": {"max_length": 256},  # the builtin tasks' programs whole, and less compute
    "evaluate": {"modes": ["full_rewrite"], "max_tasks": 2},
    "promotion": {"max_tasks": 2},
}


class OracleFirst:
    """The round's real policy, except that every rewrite request's first sample is the task's
    oracle program: the other samples are the policy's own, so pairs always exist (oracle
    chosen over a real sample) while every rejected completion is sampled from the policy."""

    def __init__(self, engine, tasks: list[Task]) -> None:
        self.engine = engine
        self.name = engine.name
        self.tasks = tasks

    def clear_prefix_cache(self) -> None:
        self.engine.clear_prefix_cache()

    def generate(self, requests):
        results = self.engine.generate(requests)
        for request, result in zip(requests, results, strict=True):
            if request.stop == "code":
                text = "\n".join(message.content for message in request.messages)
                task = max(
                    (t for t in self.tasks if t.buggy_code.strip() in text),
                    key=lambda t: len(t.buggy_code),
                )
                result.texts[0] = f"```python\n{task.oracle_code}\n```"
        return results


def logits_of(engine, text: str):
    import torch

    ids = engine.tokenizer(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        return engine.model(input_ids=ids).logits[0, -1].float()


@pytest.mark.slow
def test_two_chained_rounds_sample_and_train_on_the_promoted_policy(tmp_path, monkeypatch):
    config = load_config(
        LOCAL_ROUND_PRESET,
        {**SETTINGS, "store": {"uri": f"file://{tmp_path / 'store'}", "run": "chain"}},
    )
    store = open_store(config.store)
    seen: list = []
    real_collect = codeq.search.collect

    def collect_with_oracle_first(tasks_path, *args, engine, **kwargs):
        seen.append(engine)
        tasks = read_jsonl(tasks_path, Task)
        return real_collect(tasks_path, *args, engine=OracleFirst(engine, tasks), **kwargs)

    monkeypatch.setattr(codeq.search, "collect", collect_with_oracle_first)
    engines: dict = {}

    def round_config(number: int):
        return config.as_round(number)

    # a round whose predecessor has not finished is refused before any work
    with pytest.raises(RoundOrderError, match="round 1 of run 'chain' cannot start: round 0"):
        run_round(round_config(1), tmp_path / "out", engines=engines)
    assert not store.list("runs/chain")

    # round 0: the base policy
    run_round(round_config(0), tmp_path / "out", engines=engines)
    round0 = RoundLayout("chain", 0)
    base = current_policy(StageContext(round_config(0), store, tmp_path / "ctx"))
    assert base.adapters == []
    trajectories = read_jsonl(
        _file(store, round0.shard(0), "trajectories.jsonl", tmp_path), Trajectory
    )
    assert trajectories and all(t.policy == base for t in trajectories)
    decision = PromotionDecision.model_validate(
        store.get_json(round0.stage("promote") + "/decision.json")
    )
    assert decision.split == "validation"
    candidate = decision.candidate
    assert candidate is not None and [a.round for a in candidate.adapters] == [0]
    if not decision.promote:  # two validation tasks rarely make a significant gain
        set_current(StageContext(round_config(0), store, tmp_path / "ctx"), candidate)

    # round 1: sampled from, and trained on, round 0's promoted policy
    run_round(round_config(1), tmp_path / "out", engines=engines)
    round1 = RoundLayout("chain", 1)
    base_engine, chained_engine = seen
    assert chained_engine is engines[candidate.id] and chained_engine is not base_engine
    assert f"merged/{merged_key(candidate)}" in chained_engine.name
    prompt = "def add(a, b):\n    return a - b\n"
    difference = (logits_of(chained_engine, prompt) - logits_of(base_engine, prompt)).abs().max()
    assert difference > 1e-4
    trajectories = read_jsonl(
        _file(store, round1.shard(0), "trajectories.jsonl", tmp_path), Trajectory
    )
    assert trajectories and all(t.policy == candidate for t in trajectories)
    pairs = read_jsonl(_file(store, round1.stage("pairs"), "pairs.jsonl", tmp_path), Pair)
    assert pairs and all(p.policy == candidate for p in pairs)
    provenance = json.loads(
        _file(store, round1.stage("adapter"), "provenance.json", tmp_path).read_text()
    )
    assert Lineage.model_validate(provenance["trained_on"]) == candidate
    # replayed: round 0's pairs (written by the base) train round 1's adapter too, still
    # against round 1's policy
    round0_pairs = read_jsonl(_file(store, round0.stage("pairs"), "pairs.jsonl", tmp_path), Pair)
    assert round0_pairs and all(p.policy == base for p in round0_pairs)
    train_marker = store.marker(round1.stage("adapter"))
    assert train_marker["replayed"] == {"round 0": len(round0_pairs)}
    assert train_marker["own_pairs"] == len(pairs)
    assert train_marker["pairs"] == len(pairs) + len(round0_pairs)
    assert "round 0 pairs" in train_marker["fingerprint"]["inputs"]
    assert "replayed" not in store.marker(round0.stage("adapter"))
    metrics = store.get_json(round1.stage("adapter") + "/metrics.json")
    assert metrics["pairs"]["total"] == len(pairs) + len(round0_pairs)
    assert f"merged/{merged_key(candidate)}" in metrics["base_model"]
    first = metrics["steps"][0]  # before the first update the LoRA is zero: the policy is the
    assert first["rewards/chosen"] == pytest.approx(0.0, abs=1e-5)  # reference, so DPO's
    assert first["rewards/rejected"] == pytest.approx(0.0, abs=1e-5)  # reference is that policy
    round1_decision = store.get_json(round1.stage("promote") + "/decision.json")
    assert Lineage.model_validate(round1_decision["incumbent"]) == candidate
    # round 1's incumbent is round 0's candidate: its trees are reused (the same wall seconds
    # recorded per tree, which a second search could not reproduce), though round 1's verifier
    # is not round 0's (it breaks ties by default): answered by it, its programs scored again
    for layout in (round0, round1):
        assert store.get_json(layout.stage("eval") + "/verifier.json")["tie_break"] == "verifier"
    for split in ("validation", "test"):
        searched = f"candidate/{split}/trajectories-full_rewrite.jsonl"
        reused = f"incumbent/{split}/trajectories-full_rewrite.jsonl"
        earlier = read_jsonl(_file(store, round0.stage("eval"), searched, tmp_path), Trajectory)
        later = read_jsonl(_file(store, round1.stage("eval"), reused, tmp_path), Trajectory)
        assert later == earlier and any(t.seconds > 0 for t in later)
        results = [
            store.get_json(f"{layout.stage('eval')}/{role}/{split}/results.json")
            for layout, role in ((round0, "candidate"), (round1, "incumbent"))
        ]
        per_task = [result["modes"]["full_rewrite"]["per_task"] for result in results]
        assert per_task[0] == per_task[1]


def _file(store, prefix: str, name: str, tmp_path):
    target = tmp_path / "downloads" / prefix / name
    assert store.get_verified_file(prefix, name, target)
    return target
