"""Promotion: the new adapter becomes runs/<run>/current only when it solves more of the same
test tasks than the incumbent; the decision and its reason are written either way."""

from __future__ import annotations

import json

import pytest

from codeq.cli import run as cli_run
from codeq.config import StoreConfig
from codeq.store import RoundLayout, open_store

TASKS = ["t1", "t2", "t3", "t4"]


def results(solved: set[str], task_ids=TASKS) -> dict:
    per_task = {task: task in solved for task in task_ids}
    return {
        "task_ids": list(task_ids),
        "primary_mode": "full_rewrite",
        "modes": {
            "full_rewrite": {
                "solve_rate": sum(per_task.values()) / len(per_task),
                "ci_low": 0.0,
                "ci_high": 1.0,
                "per_task": per_task,
            }
        },
    }


def put_round(store, layout, tmp_path, *, candidate, baseline, adapter_bytes=b"weights"):
    """An adapter (or a trained=false marker when candidate is None) and a complete eval."""
    adapter_dir = tmp_path / f"adapter-{layout.round}"
    adapter_dir.mkdir()
    if candidate is not None:
        (adapter_dir / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        (adapter_dir / "adapter_model.safetensors").write_bytes(adapter_bytes)
    else:
        (adapter_dir / "metrics.json").write_text('{"trained": false}')
    store.put_dir(layout.stage("adapter"), adapter_dir)
    store.mark_complete(layout.stage("adapter"), {"trained": candidate is not None})
    eval_dir = tmp_path / f"eval-{layout.round}"
    (eval_dir / "baseline").mkdir(parents=True)
    if candidate is not None:
        (eval_dir / "results.json").write_text(json.dumps(candidate))
    (eval_dir / "baseline" / "results.json").write_text(json.dumps(baseline))
    store.put_dir(layout.stage("eval"), eval_dir)
    store.mark_complete(layout.stage("eval"))


def promote(store_root, round_number: int, capsys) -> tuple[int, str]:
    code = cli_run(
        ["promote", "--store", f"file://{store_root}", "--run", "r1", "--round", str(round_number)]
    )
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def store_root(tmp_path):
    return tmp_path / "store"


def test_better_adapter_is_promoted_then_a_tie_keeps_it(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    round0 = RoundLayout("r1", 0)
    put_round(
        store,
        round0,
        tmp_path,
        candidate=results({"t1", "t2"}),
        baseline=results({"t1"}),
        adapter_bytes=b"round-0",
    )
    code, output = promote(store_root, 0, capsys)
    assert code == 0, output
    assert "beats the incumbent" in output and "2/4 vs 1/4" in output
    decision = store.get_json(round0.stage("promote") + "/decision.json")
    assert decision["promote"] is True and decision["gained"] == ["t2"]
    assert store.get_bytes(round0.current + "/adapter_model.safetensors") == b"round-0"
    assert store.get_json(round0.current + "/CURRENT.json")["round"] == 0
    store.verify_manifest(round0.current)

    round1 = RoundLayout("r1", 1)
    put_round(
        store,
        round1,
        tmp_path,
        candidate=results({"t3", "t4"}),
        baseline=results({"t1", "t2"}),
        adapter_bytes=b"round-1",
    )
    code, output = promote(store_root, 1, capsys)
    assert code == 0, output
    assert "ties the incumbent" in output and "needs strictly more" in output
    assert store.get_json(round1.stage("promote") + "/decision.json")["promote"] is False
    assert store.get_bytes(round0.current + "/adapter_model.safetensors") == b"round-0"
    assert store.get_json(round0.current + "/CURRENT.json")["round"] == 0

    # promote is idempotent: a rerun of a decided round skips and changes nothing
    code, _ = promote(store_root, 1, capsys)
    assert code == 0
    assert store.get_bytes(round0.current + "/adapter_model.safetensors") == b"round-0"


def test_worse_adapter_is_not_promoted(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    layout = RoundLayout("r1", 0)
    put_round(store, layout, tmp_path, candidate=results(set()), baseline=results({"t1"}))
    code, output = promote(store_root, 0, capsys)
    assert code == 0
    assert "trails the incumbent" in output
    assert not store.exists(layout.current + "/CURRENT.json")
    assert store.get_json(layout.stage("promote") + "/decision.json")["lost"] == ["t1"]


def test_round_without_adapter_keeps_the_incumbent(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    layout = RoundLayout("r1", 0)
    put_round(store, layout, tmp_path, candidate=None, baseline=results({"t1"}))
    code, output = promote(store_root, 0, capsys)
    assert code == 0
    assert "no adapter was trained" in output
    assert store.is_complete(layout.stage("promote"))
    assert not store.exists(layout.current + "/CURRENT.json")


def test_different_task_ids_are_refused_without_marker(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    layout = RoundLayout("r1", 0)
    put_round(
        store,
        layout,
        tmp_path,
        candidate=results({"t1", "t2"}),
        baseline=results({"t1"}, task_ids=["t1", "t9"]),
    )
    code, output = promote(store_root, 0, capsys)
    assert code == 2
    assert [line for line in output.splitlines() if line.startswith("error:")] == [
        "error: the new and the incumbent evaluations cover different task ids"
    ]
    assert not store.is_complete(layout.stage("promote"))


def test_promote_without_evaluation_is_missing_input(store_root, capsys):
    code, output = promote(store_root, 0, capsys)
    assert code == 2
    assert "evaluation is not complete" in output
