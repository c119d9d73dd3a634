"""bench/learning_curve.py at a tiny size (SmolLM2, builtin tasks): two chained rounds of the
real pipeline, the learning-rate choice on validation, the test modes, the summary; a rerun
resumes and redoes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_curve(out: Path) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        str(REPO / "bench" / "learning_curve.py"),
        "--tiny",
        "--rounds",
        "2",
        "--learning-rates",
        "1e-3",
        "--out",
        str(out),
        "--results",
        str(out / "results"),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=3000, cwd=REPO)


@pytest.mark.slow
def test_tiny_learning_curve_runs_and_resumes(tmp_path):
    first = run_curve(tmp_path / "curve")
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((tmp_path / "curve" / "results" / "summary.json").read_text())
    base = summary["policies"]["base"]
    assert base["tasks"] == 2
    expected = {"zero_shot", "full_rewrite", "mcts", "bon", "mcts@1", "bon@2"}
    assert expected <= set(base["modes"])
    for row in base["modes"].values():
        assert 0.0 <= row["ci_low"] <= row["solve_rate"] <= row["ci_high"] <= 1.0
    assert [entry["round"] for entry in summary["rounds"]] == [0, 1]
    for entry in summary["rounds"]:
        assert isinstance(entry["promoted"], bool) and entry["reason"]
        if entry["pairs"]:  # a round with pairs trained with the chosen learning rate
            assert entry["learning_rate"] == 1e-3
        if entry["pairs"] and not entry["promoted"]:  # its candidate is measured on test too
            paired = entry["test_candidate_vs_incumbent"]
            assert paired["incumbent"] in summary["policies"]
            assert {"zero_shot", "full_rewrite"} <= set(paired)
            candidate = summary["policies"][f"round-{entry['round']}-candidate"]
            assert candidate["tasks"] == 2 and "mcts" not in candidate["modes"]
    choice = json.loads((tmp_path / "curve" / "results" / "learning-rate.json").read_text())
    assert choice["chosen_run"] == "curve-lr0.001"
    alpha = json.loads((tmp_path / "curve" / "results" / "pairs-alpha.json").read_text())
    assert alpha["alpha"] in (0.5, 1.0) and "critique" in alpha["rule"]
    assert summary["timings_seconds"]
    assert "| mode | base" in first.stdout

    again = run_curve(tmp_path / "curve")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "starting" not in "".join(
        line for line in again.stderr.splitlines() if line.startswith("[curve]")
    )

    # what the searches show, read from the same run's trajectories and scored again
    findings = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "curve_findings.py"),
            "--eval",
            str(tmp_path / "curve" / "eval"),
            "--tasks",
            str(tmp_path / "curve" / "work" / "tasks-test" / "test.jsonl"),
            "--json",
            str(tmp_path / "findings.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert findings.returncode == 0, findings.stderr[-3000:]
    found = json.loads((tmp_path / "findings.json").read_text())
    recorded = json.loads((tmp_path / "curve" / "results" / "base-test.json").read_text())
    for mode in ("zero_shot", "full_rewrite", "mcts", "bon"):
        row = found["base"][mode]
        assert row["tasks"] == 2 and row["rewrites"] >= 2
        assert row["returned_program"]["per_task"] == recorded["modes"][mode]["per_task"]
