"""bench/collection_modes.py at a tiny size (SmolLM2, builtin tasks): after a tiny curve, each
search mode collects round 0 again in its own run, trains and is decided against the base model
on validation pass counts; MCTS's arm is the curve's own round 0; the rule picks a mode and a
rerun reads the finished arms instead of running them (check_collection_arms, run at the end of
tests/test_learning_curve.py's tiny curve test, on its curve)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, timeout=3000, cwd=REPO
    )


def check_collection_arms(tmp_path: Path, curve: list[str], results: Path) -> None:
    """The arms on a tiny curve that has run (its options `curve`, its --results `results`):
    called by tests/test_learning_curve.py's tiny curve test, so that the suite builds one tiny
    curve for both (each costs minutes of CI)."""
    decision_file = tmp_path / "arms" / "decision.json"
    bench = [str(REPO / "bench" / "collection_modes.py"), "--json", str(decision_file)]
    bench += ["--samples", "2", "--", *curve]
    first = run(bench)
    assert first.returncode == 0, first.stderr[-3000:]
    decision = json.loads(decision_file.read_text())
    modes = ("mcts", "bon", "mt_bon")
    assert set(decision["passes"]) | set(decision["without_candidate"]) == set(modes)
    assert (
        decision["search_mode"] in {"mcts", "bon", "mt_bon"} and decision["verdict"] in first.stdout
    )
    # an arm whose collect gave no pairs (tiny multi-turn: one sample a turn has no siblings)
    # trains no candidate and is left out of the pairing, said so
    trained = [mode for mode in ("bon", "mt_bon") if mode not in decision["without_candidate"]]
    assert [row["mode"] for row in decision["against_mcts"]] == [f"{m} vs mcts" for m in trained]
    assert "bon" in trained  # best-of-2's siblings differ: pairs, an adapter, a candidate
    arms = {mode: json.loads((tmp_path / "arms" / f"{mode}.json").read_text()) for mode in modes}
    # equal programs: MCTS's rollouts x K, best-of-that, multi-turn half of it a turn for 2 turns
    budget = arms["mcts"]["programs_at_most"]
    assert arms["bon"]["search"]["bon_samples"] == budget
    assert (
        arms["mt_bon"]["search"]["mt_bon_samples"] * arms["mt_bon"]["search"]["mt_bon_turns"]
        == budget
    )
    for mode, arm in arms.items():
        assert arm["search"]["mode"] == mode and arm["run"] == f"collect-{mode}"
        if mode in decision["without_candidate"]:
            assert not arm["pairs"] and arm["decision"]["candidate"] is None
            continue
        assert arm["decision"]["samples"] == 2  # decided on pass counts, not greedy answers
        [gate] = arm["decision"]["comparisons"]
        assert gate["test"] == "sign_flip" and gate["pass_counts"]["samples"] == 2
    # MCTS's arm is the curve's round 0: its adapter, not a new one
    round_0 = json.loads((results / "round-0.json").read_text())

    def adapters(lineage: dict) -> list[str]:
        return [link["sha256"] for link in lineage["adapters"]]

    assert adapters(arms["mcts"]["decision"]["candidate"]) == adapters(round_0["candidate"])
    # best-of-N trained its own (at this size one MCTS rollout of K = 2 is best-of-2, so the
    # same seeded programs may give the same weights)
    [link] = arms["bon"]["decision"]["candidate"]["adapters"]
    assert link["source"] == "runs/collect-bon/round-0/adapter"
    assert arms["bon"]["collect"] and arms["bon"]["global_steps"]
    # every arm's base model is the same policy, and a deterministic search answers alike
    from codeq.evaluate.results import EvalResults

    gate = decision["gate_mode"]
    bases = [
        EvalResults.load(tmp_path / "arms" / f"{mode}-base-validation.json")
        for mode in ["mcts", *trained]
    ]
    assert len({base.policy.id for base in bases}) == 1
    assert all(base.modes[gate].per_task == bases[0].modes[gate].per_task for base in bases)
    # ... so the base model is searched once: MCTS's arm's trees are every other arm's
    for mode in ("bon", "mt_bon"):
        assert (
            f"[arms] {mode}: the base model's test trees reused from collect-mcts" in first.stderr
        )
    assert "[arms] bon: the base model's validation trees reused from collect-mcts" in first.stderr

    # kept for git as each arm finished: MCTS's evaluation (the base trees the others reuse)
    kept = json.loads(
        (tmp_path / "arms" / "progress" / "collect-mcts" / "partial.json").read_text()
    )
    assert kept["keys"] and all("/round-0/eval/" in key for key in kept["keys"])
    assert [path.name for path in (tmp_path / "arms" / "progress").iterdir()] == ["collect-mcts"]

    again = run(bench)
    assert again.returncode == 0, again.stderr[-3000:]
    arms_lines = [line for line in again.stderr.splitlines() if line.startswith("[arms]")]
    assert len(arms_lines) == 3 and all(": read from " in line for line in arms_lines)
    assert json.loads(decision_file.read_text())["passes"] == decision["passes"]


def test_the_bench_refuses_arms_without_mcts(tmp_path):
    refused = run(
        [
            str(REPO / "bench" / "collection_modes.py"),
            "--json",
            str(tmp_path / "d.json"),
            "--arms",
            "bon",
            "--",
            "--tiny",
        ]
    )
    assert refused.returncode != 0 and "--arms must include mcts" in refused.stderr


def arms_on(out: Path) -> Any:
    """collection_modes.Arms on a tiny curve's config with its store under `out`."""
    sys.path.insert(0, str(REPO / "bench"))
    import collection_modes
    import learning_curve

    from codeq.config import load_config

    curve_args = learning_curve.sized(learning_curve.parse_args(["--tiny", "--out", str(out)]))
    config = load_config(None, learning_curve.curve_settings(curve_args))
    return collection_modes, collection_modes.Arms(curve_args, config, "curve-lr0.001")


def test_an_unfinished_arm_is_kept_for_git_and_restored_into_a_fresh_store(tmp_path):
    """--persist copies an unfinished arm's own store objects (not what it copied from the
    curve's rounds, nor a train's checkpoints) beside --json; the next run on a fresh store puts
    them back; a finished arm's copy is spent, except MCTS's evaluation, which the other arms
    start from; a tampered file or other settings are refused with one line."""
    from codeq.errors import CorruptInputError

    bench, arms = arms_on(tmp_path / "machine-1")
    folder = tmp_path / "results"
    objects = {
        "tasks/train.jsonl": b"copied from the curve's round 0\n",
        "trajectories/shard-0/trajectories.jsonl": b'{"tree": 1}\n' * 2000,
        "trajectories/shard-0/_COMPLETE": b"{}",
        "eval-progress/incumbent/validation/trees/t1.json": b'{"task": "t1"}',
        "eval/incumbent/validation/results.json": b'{"solved": 1}',
        "eval/_COMPLETE": b"{}",
        "train-progress/checkpoint-1/adapter_model.safetensors": b"weights",
    }
    for mode in ("bon", "mcts"):
        for inside, data in objects.items():
            arms.store.put_bytes(f"runs/collect-{mode}/round-0/{inside}", data)

    assert "5 store objects kept" in arms.persist(folder, "bon", 2, finished=False)
    kept = json.loads((folder / "progress" / "collect-bon" / "partial.json").read_text())["keys"]
    assert sorted(key.split("round-0/")[1] for key in kept) == sorted(
        [key for key in objects if not key.startswith(("tasks/", "train-progress/"))]
    )
    assert any(entry["file"].endswith(".xz") for entry in kept.values())  # packed where it pays
    # MCTS's copied round 0 (trajectories, pairs, adapter) stays out; finished, its evaluation
    # alone is kept
    arms.persist(folder, "mcts", 2, finished=True)
    kept = json.loads((folder / "progress" / "collect-mcts" / "partial.json").read_text())["keys"]
    assert sorted(key.split("round-0/")[1] for key in kept) == [
        "eval/_COMPLETE",
        "eval/incumbent/validation/results.json",
    ]

    _, fresh = arms_on(tmp_path / "machine-2")
    for mode in ("bon", "mcts"):
        fresh.restore(folder, mode, 2)
    for key in json.loads((folder / "progress" / "collect-bon" / "partial.json").read_text())[
        "keys"
    ]:
        assert fresh.store.get_bytes(key) == arms.store.get_bytes(key)
    assert fresh.store.is_complete("runs/collect-mcts/round-0/eval")
    assert not fresh.store.exists("runs/collect-bon/round-0/tasks/train.jsonl")
    fresh.restore(folder, "bon", 2)  # again: the store holds the same, nothing changes

    # finished, bon's copy is spent
    assert "finished" in arms.persist(folder, "bon", 2, finished=True)
    assert not (folder / "progress" / "collect-bon").exists()

    # a kept file that fails its sha256, or other settings, is refused naming it
    [packed] = (folder / "progress" / "collect-mcts").rglob("results.json")
    packed.write_bytes(b'{"solved": 2}')
    _, third = arms_on(tmp_path / "machine-3")
    with pytest.raises(CorruptInputError, match="results.json fails its sha256"):
        third.restore(folder, "mcts", 2)
    with pytest.raises(CorruptInputError, match="other curve settings"):
        third.restore(folder, "mcts", 3)  # promotion.samples 3, not the 2 it was kept with
    assert bench.progress_folder(folder, "mcts") == folder / "progress" / "collect-mcts"
