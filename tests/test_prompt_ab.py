"""bench/prompt_ab.py at a tiny size: the real engine (SmolLM2) and sandbox compare two first-turn
prompts on the same tasks and refine the failing answers; the table adds up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def first_turn(run):
    return [(row["task_id"], row["copied"], row["empty"]) for row in run["tasks"]]


@pytest.mark.slow
def test_prompt_ab_compares_variants_on_the_same_tasks(tmp_path):
    tasks = tmp_path / "tasks"
    prepare = [sys.executable, "-m", "codeq", "prepare", "--source", "builtin", "-o", str(tasks)]
    done = subprocess.run(prepare, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "ab.json"
    command = [
        sys.executable,
        str(REPO / "bench" / "prompt_ab.py"),
        "--tasks",
        str(tasks / "train.jsonl"),
        "--model",
        "smollm2",
        "--max-tasks",
        "2",
        "--max-new-tokens",
        "24",
        "--refine-samples",
        "1",
        "--variants",
        "detailed",
        "plain",
        "plain_one_turn",
        "--json",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| detailed | " in done.stdout and "| plain | " in done.stdout
    result = json.loads(out.read_text())
    detailed, plain, plain_one_turn = result["runs"]
    assert [row["task_id"] for row in detailed["tasks"]] == [
        row["task_id"] for row in plain["tasks"]
    ]
    # the same first turn, reused rather than decoded again; only the refinement's prompt differs
    assert plain_one_turn["first_turn_of"] == "plain" and "first_turn_of" not in plain
    assert plain_one_turn["tasks"] == plain["tasks"]
    assert first_turn(plain_one_turn) == first_turn(plain)
    assert plain_one_turn["refine"]["parents"] == plain["refine"]["parents"]
    for row, run in zip(result["table"], result["runs"], strict=True):
        assert row["tasks"] == 2
        assert row["solved"] == sum(task["solved"] for task in run["tasks"])
        assert 0.0 <= row["ci95"][0] <= row["solved"] / 2 <= row["ci95"][1] <= 1.0
        refine = run["refine"]
        assert refine["rewrites"] == refine["parents"]  # one sample per failing answer
        assert refine["copies"] + refine["empty"] <= refine["rewrites"]
        assert len(refine["tasks_rescued"]) <= refine["solved_rewrites"]
    assert result["table"][0]["gained_vs_first"] == result["table"][0]["lost_vs_first"] == 0
