from __future__ import annotations

import base64
import json
from html.parser import HTMLParser

import pytest

from codeq import cli
from codeq.errors import BadInputError, MissingInputError
from codeq.evaluate import ANY_NODE_LABEL, summarize
from codeq.report import render_report
from codeq.schemas import Task, write_json


def task(task_id: str, level: str, category: str) -> Task:
    return Task(
        task_id=task_id,
        slug=task_id,
        level=level,  # type: ignore[arg-type]
        category=category,  # type: ignore[arg-type]
        subtype="condition error",
        description="",
        examples=[],
        buggy_code="",
        oracle_code="",
        visible_tests=[],
        hidden_tests=[],
    )


TASKS = [task("a", "easy", "logic"), task("b", "medium", "syntax"), task("c", "hard", "logic")]


def results(model: str, solved: dict[str, bool], adapter: str | None) -> dict:
    stats = summarize(TASKS, solved)
    return {
        "model": model,
        "adapter": adapter,
        "task_ids": [t.task_id for t in TASKS],
        "primary_mode": "mcts",
        "modes": {"zero_shot": summarize(TASKS, dict.fromkeys(solved, False)), "mcts": stats},
        "mcts_rollout_ablation": {"1": summarize(TASKS, {**solved, "a": False}), "2": stats},
        "any_node_passed": {"label": ANY_NODE_LABEL, **stats, "per_task": solved},
    }


TRAIN_METRICS = {
    "base_model": "smollm2",
    "precision": "bf16",
    "pairs": {"total": 10, "train": 8, "held_out": 2, "dropped_over_max_length": 1},
    "global_steps": 2,
    "train_loss": 0.68,
    "heldout_reward_accuracy": 0.75,
    "heldout_reward_accuracy_final": 0.5,
    "best_step": 1,
    "tokens": {"real_to_padded": 0.97},
    "steps": [
        {"step": 1, "loss": 0.69, "rewards/accuracies": 0.0, "rewards/margins": 0.0},
        {"step": 2, "loss": 0.6, "rewards/accuracies": 1.0, "rewards/margins": 0.3},
    ],
    "eval": [{"step": 2, "eval_rewards/accuracies": 0.75, "eval_rewards/margins": 0.1}],
}
PAIR_STATS = {
    "pairs": 10,
    "trajectories": 4,
    "tasks_with_pairs": 3,
    "by_level": {"easy": 10},
    "by_category": {"logic": 10},
    "dropped": {"degenerate": 4, "small_gap": 2},
}


class ImageCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tables: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values["src"])
        if tag == "table":
            self.tables.append(values.get("id", ""))


def test_report_renders_json_markdown_and_self_contained_html(tmp_path) -> None:
    adapter = results("smollm2", {"a": True, "b": True, "c": False}, "round-0/adapter")
    base = results("smollm2", {"a": True, "b": False, "c": False}, None)
    write_json(tmp_path / "eval" / "results.json", adapter)
    index = render_report(
        tmp_path / "report",
        results=tmp_path / "eval",
        base_results=base,
        train_metrics=TRAIN_METRICS,
        pair_stats=PAIR_STATS,
    )
    assert index == tmp_path / "report" / "index.html"

    summary = json.loads((tmp_path / "report" / "report.json").read_text())
    assert summary["evaluation"]["modes"]["mcts"]["solved"] == 2
    assert summary["base_evaluation"]["modes"]["mcts"]["solved"] == 1
    comparison = summary["comparison"]["modes"]["mcts"]
    assert comparison["gained"] == ["b"] and comparison["lost"] == []
    assert summary["evaluation"]["any_node_passed"]["label"] == ANY_NODE_LABEL

    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| mcts | 2/3 | 66.7% |" in markdown
    assert "optimistic any-node figure" in markdown
    assert "degenerate 4" in markdown

    parser = ImageCollector()
    html = index.read_text()
    parser.feed(html)
    # mode, category, level, rollout ablation, DPO curves
    assert len(parser.images) == 5
    for src in parser.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"modes", "comparison", "train", "pairs"} <= set(parser.tables)
    assert "http://" not in html and "https://" not in html  # nothing fetched when opened


def test_report_inputs_are_checked(tmp_path) -> None:
    with pytest.raises(BadInputError, match="nothing to report"):
        render_report(tmp_path / "r")
    with pytest.raises(MissingInputError):
        render_report(tmp_path / "r", results=tmp_path / "missing.json")


def test_report_command_writes_the_report(tmp_path) -> None:
    write_json(tmp_path / "train" / "metrics.json", TRAIN_METRICS)
    write_json(tmp_path / "pairs" / "stats.json", PAIR_STATS)
    code = cli.run(
        [
            "report",
            "--train",
            str(tmp_path / "train"),
            "--pairs",
            str(tmp_path / "pairs" / "stats.json"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    html = (tmp_path / "out" / "index.html").read_text()
    assert "DPO reward accuracy" in html and "0.750" in html


def test_report_of_a_round_without_a_new_adapter(tmp_path) -> None:
    base = results("smollm2", {"a": True, "b": False, "c": False}, None)
    index = render_report(
        tmp_path / "r",
        base_results=base,
        train_metrics={"trained": False, "reason": "no preference pairs"},
        pair_stats={**PAIR_STATS, "pairs": 0},
    )
    summary = json.loads((tmp_path / "r" / "report.json").read_text())
    assert summary["evaluation"]["modes"]["mcts"]["solved"] == 1
    assert summary["train_skipped"] == "no preference pairs"
    assert "no preference pairs" in index.read_text()
