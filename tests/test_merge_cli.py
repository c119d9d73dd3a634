"""The learning stages chained through the CLI on the tiny model: pairs -> train -> merge ->
evaluate (the merged model as the next round's policy) -> report."""

from __future__ import annotations

import json

from codeq import cli
from codeq.schemas import ChatMessage, Node, Trajectory, write_jsonl


def tree(task_id: str, good: str, bad: str) -> Trajectory:
    prompt = [ChatMessage(role="user", content=f"Fix {task_id}:\ndef f(a):\n    return a-1")]
    nodes = [
        Node(id=0, parent=None, depth=0, program="def f(a):\n    return a-1"),
        Node(
            id=1,
            parent=0,
            depth=1,
            rollout=1,
            prompt=prompt,
            completion=good,
            program=good,
            q_mcts=1.0,
            q_ai=0.9,
        ),
        Node(
            id=2,
            parent=0,
            depth=1,
            rollout=1,
            prompt=prompt,
            completion=bad,
            program=bad,
            q_mcts=0.0,
            q_ai=0.4,
        ),
    ]
    return Trajectory(
        task_id=task_id,
        slug=task_id,
        level="easy",
        category="logic",
        subtype="operation error",
        mode="mcts",
        reward_tests="all",
        nodes=nodes,
        solved=True,
        first_pass_node=1,
        final_node=1,
    )


def test_pairs_train_merge_evaluate_report_chain(tmp_path, tiny_model_dir, monkeypatch) -> None:
    trajectories = [
        tree(
            f"task{i}", f"```python\ndef f(a):\n    return a + {i}\n```", f"```python\nf = {i}\n```"
        )
        for i in range(8)
    ]
    write_jsonl(tmp_path / "collect" / "shard-0" / "trajectories.jsonl", trajectories)
    monkeypatch.setenv("CODEQ_TRAIN__LORA_R", "4")
    monkeypatch.setenv("CODEQ_TRAIN__LORA_ALPHA", "8")
    monkeypatch.setenv("CODEQ_TRAIN__PER_DEVICE_BATCH_SIZE", "2")
    monkeypatch.setenv("CODEQ_TRAIN__GRADIENT_ACCUMULATION_STEPS", "1")
    monkeypatch.setenv("CODEQ_TRAIN__EVAL_FRACTION", "0.25")
    monkeypatch.setenv("CODEQ_POLICY__MAX_NEW_TOKENS", "16")
    model = str(tiny_model_dir)

    assert cli.run(["pairs", str(tmp_path / "collect"), "--out", str(tmp_path / "pairs")]) == 0
    assert json.loads((tmp_path / "pairs" / "stats.json").read_text())["pairs"] == 8
    assert (
        cli.run(
            [
                "train",
                str(tmp_path / "pairs"),
                "--out",
                str(tmp_path / "train"),
                "--model",
                model,
                "--max-steps",
                "2",
                "--learning-rate",
                "1e-3",
            ]
        )
        == 0
    )
    assert (tmp_path / "train" / "adapter" / "adapter_model.safetensors").is_file()
    assert (
        cli.run(
            [
                "merge",
                str(tmp_path / "train" / "adapter"),
                "--out",
                str(tmp_path / "merged"),
                "--model",
                model,
            ]
        )
        == 0
    )
    assert (tmp_path / "merged" / "model.safetensors").is_file()

    assert cli.run(["prepare", "--source", "builtin", "--out", str(tmp_path / "tasks")]) == 0
    assert (
        cli.run(
            [
                "evaluate",
                str(tmp_path / "tasks"),
                "--out",
                str(tmp_path / "eval"),
                "--model",
                str(tmp_path / "merged"),
                "--modes",
                "zero_shot,full_rewrite",
                "--max-tasks",
                "2",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["model"] == str(tmp_path / "merged")
    assert results["primary_mode"] == "zero_shot"
    assert list(results["modes"]) == ["zero_shot", "full_rewrite"]
    assert results["modes"]["zero_shot"]["n"] == 2 == len(results["task_ids"])

    assert (
        cli.run(
            [
                "report",
                "--eval",
                str(tmp_path / "eval"),
                "--train",
                str(tmp_path / "train"),
                "--pairs",
                str(tmp_path / "pairs"),
                "--out",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    assert (tmp_path / "report" / "index.html").stat().st_size > 10_000
