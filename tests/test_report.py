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


def test_report_draws_intervals_whose_ends_drift_past_the_rate(tmp_path) -> None:
    # results written before wilson_interval pinned its ends: 0 of n with a lower bound ~1e-17
    base = results("smollm2", {"a": False, "b": False, "c": False}, None)
    for entry in base["modes"]["mcts"]["by_category"].values():
        entry["ci_low"] = entry["solve_rate"] + 2.7755575615628914e-17
    adapter = results("smollm2", {"a": True, "b": False, "c": False}, "round-0/adapter")
    write_json(tmp_path / "eval" / "results.json", adapter)
    index = render_report(tmp_path / "report", results=tmp_path / "eval", base_results=base)
    parser = ImageCollector()
    parser.feed(index.read_text())
    assert len(parser.images) == 4  # mode, category, level, rollout ablation


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


# ------------------------------------------------------------------------ the report stage


def eval_results(split: str, solved: dict[str, bool], policy) -> dict:
    tasks = [task(task_id, "easy", "logic") for task_id in solved]
    return {
        "model": "smollm2",
        "policy": policy.model_dump(mode="json"),
        "split": split,
        "task_ids": list(solved),
        "primary_mode": "full_rewrite",
        "confidence": 0.95,
        "modes": {"full_rewrite": summarize(tasks, solved)},
    }


def eval_trajectories(solved: dict[str, bool]) -> list:
    from test_pairs import node, trajectory

    trees = []
    for task_id in solved:
        buggy = f"def f(x):\n    return x - 1  # {task_id}\n"
        fixed = buggy.replace("x - 1", "x + 1")
        tree = trajectory([node(0, None, buggy, 0.0), node(1, 0, fixed, 1.0)], task_id=task_id)
        trees.append(tree.model_copy(update={"final_node": 1}))
    return trees


def test_report_stage_renders_verdict_names_diffs_times_and_fingerprints(tmp_path) -> None:
    """A round's real stage outputs (pairs, train and promote run as stages; the evaluation's
    files written as the evaluate stage writes them) rendered by the report stage."""
    from test_rerun import LAYOUT, POLICY, context, gap, store_with_a_shard

    from codeq.pipeline.stages import pairs_stage, promote_stage, report_stage, train_stage
    from codeq.schemas import AdapterLink, write_jsonl

    store = store_with_a_shard(tmp_path)
    settings = {**gap(1.0), "promotion": {"modes": ["full_rewrite"], "level": 0.6}}
    pairs_stage(context(store, tmp_path, **settings))
    train_stage(context(store, tmp_path, **settings))
    candidate = POLICY.extended(
        AdapterLink(round=0, sha256="b" * 64, source=LAYOUT.stage("adapter"))
    )
    validation = {"v1": True, "v2": True, "v3": False}
    test_solved = {"t9": True, "t2": True, "t5": False, "t1": True, "t7": True}
    incumbent_test = {"t9": False, "t2": True, "t5": True, "t1": False, "t7": True}
    folder = tmp_path / "eval"
    for role, policy, val, test in (
        ("candidate", candidate, validation, test_solved),
        ("incumbent", POLICY, {"v1": False, "v2": True, "v3": False}, incumbent_test),
    ):
        write_json(
            folder / role / "validation" / "results.json", eval_results("validation", val, policy)
        )
        write_json(folder / role / "test" / "results.json", eval_results("test", test, policy))
        write_jsonl(
            folder / role / "test" / "trajectories-full_rewrite.jsonl", eval_trajectories(test)
        )
    store.put_dir(LAYOUT.stage("eval"), folder)
    store.mark_complete(LAYOUT.stage("eval"), {"seconds": 75.5})
    promote_stage(context(store, tmp_path, **settings))
    report_stage(context(store, tmp_path, **settings))

    target = tmp_path / "out" / "report.md"
    assert store.get_verified_file(LAYOUT.stage("report"), "report.md", target)
    markdown = target.read_text()
    for python_repr in ("{'", "['", "':", "None", "True", "False", "Lineage("):
        assert python_repr not in markdown, (python_repr, markdown)
    assert "## Promotion: promoted" in markdown
    assert "| full_rewrite | 3 | 2 | 1 | 0.5000 | 1.0000 |" in markdown  # the McNemar statistic
    assert "- full_rewrite: gained v1; lost none" in markdown  # validation, from the decision
    assert "- full_rewrite: gained t1, t9; lost t5" in markdown  # test, from the eval results
    examples = markdown.split("## Example fixes")[1].split("\n## ")[0]
    assert [line for line in examples.splitlines() if line.startswith("### ")] == [
        "### t1 (easy, logic)",
        "### t2 (easy, logic)",
        "### t7 (easy, logic)",
    ]  # three solved test tasks in task-id order; t5 was not solved
    assert "-    return x - 1  # t1\n+    return x + 1  # t1" in examples
    stages = markdown.split("## Stages")[1]
    pairs_marker = store.marker(LAYOUT.stage("pairs"))
    assert (
        f"| pairs | {pairs_marker['seconds']:.1f}s | `{pairs_marker['fingerprint']['sha256'][:12]}` |"
        in stages
    )
    assert "| evaluate | 1m 15.5s | – |" in stages  # a marker without a fingerprint
    assert "| collect shard-0 |" in stages
    html = tmp_path / "out" / "index.html"
    assert store.get_verified_file(LAYOUT.stage("report"), "index.html", html)
    page = html.read_text()
    assert 'id="stages"' in page and 'id="promotion"' in page and "x + 1  # t1" in page
