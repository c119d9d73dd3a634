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


def test_report_says_which_pairs_were_replayed_from_earlier_rounds(tmp_path) -> None:
    replaying = {**TRAIN_METRICS, "replayed": {"round 3": 4, "round 4": 3}}
    render_report(tmp_path / "report", train_metrics=replaying, pair_stats=PAIR_STATS)
    line = "replayed from earlier rounds (train.earlier_rounds): round 3: 4, round 4: 3 of the 10"
    assert line in (tmp_path / "report" / "report.md").read_text()
    assert (
        "round 3: 4, round 4: 3 of the 10 pairs" in (tmp_path / "report" / "index.html").read_text()
    )
    render_report(tmp_path / "alone", train_metrics=TRAIN_METRICS, pair_stats=PAIR_STATS)
    assert "replayed" not in (tmp_path / "alone" / "report.md").read_text()


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


# ------------------------------------------------------- what to do next, warnings, the curve


def decision(
    validation: dict[str, tuple[bool, bool]],
    level: float = 0.05,
    round_number: int = 0,
    policies: tuple | None = None,
):
    """A real promotion decision: validation task -> (candidate solved, incumbent solved);
    policies: (candidate, incumbent) lineages, by default round N's adapter on the base."""
    from test_rerun import POLICY

    from codeq.config import PromotionConfig
    from codeq.evaluate.results import EvalResults
    from codeq.promotion import decide
    from codeq.schemas import AdapterLink

    candidate, incumbent = policies or (
        POLICY.extended(AdapterLink(round=round_number, sha256="b" * 64, source="x")),
        POLICY,
    )
    results = {
        role: EvalResults.model_validate(
            eval_results("validation", {t: pair[index] for t, pair in validation.items()}, policy)
        )
        for index, (role, policy) in enumerate((("candidate", candidate), ("incumbent", incumbent)))
    }
    # these results hold full_rewrite only: no guard mode (where the config has the key)
    unguarded = {"guard_modes": []} if "guard_modes" in PromotionConfig.model_fields else {}
    config = PromotionConfig(modes=["full_rewrite"], level=level, **unguarded)
    return decide(round_number, results["candidate"], results["incumbent"], config)


def next_steps(tmp_path, made, **inputs) -> str:
    render_report(tmp_path / "r", decision=made, pair_stats=PAIR_STATS, **inputs)
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "## What to do next" in markdown
    return markdown.split("## What to do next")[1]


def test_a_validation_too_small_to_promote_says_so_and_what_to_try(tmp_path) -> None:
    # the demo: 4 builtin validation tasks, the candidate answers as the incumbent (p = 1)
    made = decision({f"v{i}": (False, False) for i in range(4)})
    assert not made.promote
    text = next_steps(tmp_path, made)
    assert "no candidate could have been" in text
    assert "the incumbent fails 4 of the 4 validation tasks" in text and "p = 0.0625" in text
    assert "at least 5 tasks going the candidate's way and none the other" in text
    assert "Rtian/DebugBench" in text and "Qwen2.5-Coder-0.5B" in text


def test_a_gain_too_small_for_the_validation_says_how_many_gains_it_needed(tmp_path) -> None:
    # the second curve's round 0: +8 / -2 of 143, p = 0.055
    validation = {f"g{i}": (True, False) for i in range(8)}
    validation.update({f"l{i}": (False, True) for i in range(2)})
    validation.update({f"s{i}": (False, False) for i in range(133)})
    text = next_steps(tmp_path, decision(validation))
    assert "cannot tell a gain this small from chance" in text
    assert "+8 / -2 of 143 validation tasks" in text and "p = 0.0547" in text
    assert "with 10 tasks changed, 9 of them would have to be gains" in text
    assert "starts from the incumbent again" in text


def test_a_promotion_says_the_next_round_samples_from_it(tmp_path) -> None:
    made = decision({f"v{i}": (True, False) for i in range(5)})
    assert made.promote
    adapter = results("smollm2", {"a": True, "b": True, "c": False}, "round-0/adapter")
    base = results("smollm2", {"a": True, "b": False, "c": False}, None)
    for data in (adapter, base):
        data["primary_mode"] = "full_rewrite"
        data["modes"]["full_rewrite"] = data["modes"]["mcts"]
    text = next_steps(tmp_path, made, results=adapter, base_results=base)
    assert "Promoted: round 0's candidate is now the run's policy" in text
    assert "next round samples its trajectories from it" in text
    assert "it solves 2 of 3 in full_rewrite against the incumbent's 1 (+1 / -0)" in text


def test_a_forced_promotion_says_so_in_the_heading_and_the_advice(tmp_path) -> None:
    made = decision({f"v{i}": (False, False) for i in range(4)})
    made = made.model_copy(update={"promote": True, "forced": True})
    render_report(tmp_path / "r", decision=made, pair_stats=PAIR_STATS)
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "## Promotion: promoted by promotion.force_rounds" in markdown
    assert "forced (promotion.force_rounds), not earned on validation" in markdown


def test_no_adapter_trained_says_there_was_nothing_to_promote(tmp_path) -> None:
    from codeq.config import PromotionConfig
    from codeq.promotion import decide

    made = decide(2, None, None, PromotionConfig(modes=["full_rewrite"]))
    render_report(
        tmp_path / "r",
        decision=made,
        train_metrics={"trained": False, "reason": "no preference pairs"},
        pair_stats={**PAIR_STATS, "pairs": 0},
    )
    text = (tmp_path / "r" / "report.md").read_text().split("## What to do next")[1]
    assert "no adapter was trained in round 2 (no preference pairs)" in text


def test_each_warning_says_whether_it_matters_for_this_run(tmp_path) -> None:
    no_held_out = {
        **TRAIN_METRICS,
        "pairs": {"total": 10, "train": 8, "held_out": 0, "dropped_over_max_length": 2},
        "heldout_reward_accuracy": None,
        "heldout_reward_accuracy_final": None,
        "best_step": None,
        "eval": [],
    }
    blended = {**PAIR_STATS, "critique_auc": 0.0, "config": {"alpha": 0.5}}
    index = render_report(tmp_path / "r", train_metrics=no_held_out, pair_stats=blended)
    markdown = (tmp_path / "r" / "report.md").read_text()
    warnings = markdown.split("## Warnings, and whether they matter here")[1]
    assert "critique AUC 0.00 (0.5 is chance) blended at pairs.alpha=0.5" in warnings
    assert "It matters for this run" in warnings and "Set pairs.alpha=1.0" in warnings
    assert "2 of 10 pairs longer than train.max_length were dropped" in warnings
    assert "20% of the pairs did not train" in warnings
    assert "no held-out pairs" in warnings and "It does not change the promotion" in warnings
    # the held-out step is named only when there was one
    assert "step None" not in markdown and "at step None" not in index.read_text()
    assert "held-out reward accuracy: no held-out pairs" in markdown
    assert "no held-out pairs" in index.read_text()

    # the same critique, no pairs built: the warning does not matter here
    render_report(tmp_path / "s", pair_stats={**blended, "pairs": 0})
    again = (tmp_path / "s" / "report.md").read_text()
    assert "It does not matter for this run: no pairs were built." in again
    # test rewards alone (alpha 1): the critique is not used, no warning
    render_report(tmp_path / "t", pair_stats={**blended, "config": {"alpha": 1.0}})
    assert "## Warnings" not in (tmp_path / "t" / "report.md").read_text()


def test_the_advice_uses_the_promotion_test_and_the_pairs_threshold() -> None:
    from codeq.pairs import CRITIQUE_SIGNAL_AUC
    from codeq.promotion import one_sided_mcnemar
    from codeq.report import advice

    assert advice.CRITIQUE_SIGNAL_AUC == CRITIQUE_SIGNAL_AUC
    for gained in range(12):
        for lost in range(12):
            assert advice.exact_p(gained, lost) == one_sided_mcnemar(gained, lost)
    assert advice.fewest_gains(0.05) == 5 and advice.gains_needed(10, 0.05) == 9


def test_plots_name_the_tests_programs_are_scored_on(tmp_path, monkeypatch) -> None:
    import matplotlib.axes

    labels: list[str] = []
    original = matplotlib.axes.Axes.set_ylabel

    def record(self, label, *args, **kwargs):
        labels.append(label)
        return original(self, label, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel", record)
    adapter = results("smollm2", {"a": True, "b": True, "c": False}, "round-0/adapter")
    base = results("smollm2", {"a": True, "b": False, "c": False}, None)
    rate = {"n": 3, "solved": 1, "solve_rate": 1 / 3, "ci_low": 0.06, "ci_high": 0.79}
    curve = [
        {"label": "before round 0", "promoted": None, "validation": None, "modes": {"m": rate}},
        {"label": "round 0", "promoted": True, "validation": None, "modes": {"m": rate}},
        {"label": "round 1", "promoted": False, "validation": None, "modes": {"m": rate}},
    ]
    render_report(tmp_path / "r", results=adapter, base_results=base, learning_curve=curve)
    assert len(labels) == 5  # mode, category, level, rollout ablation, learning curve
    assert all("visible + hidden tests" in label for label in labels), labels
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "scored on visible and hidden tests" in markdown


def test_the_learning_curve_marks_kept_out_candidates_hollow() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from codeq.report.plots import draw_learning_curve

    rate = {"n": 60, "solved": 6, "solve_rate": 0.1, "ci_low": 0.05, "ci_high": 0.2}
    points = [
        {"label": "base", "promoted": None, "validation": None, "modes": {"m": rate}},
        {
            "label": "round 0",
            "promoted": False,
            "validation": {"gained": 8, "lost": 2, "p_better": 0.0546875},
            "modes": {"m": rate},
        },
        {
            "label": "round 1",
            "promoted": True,
            "validation": {"gained": 16, "lost": 5, "p_better": 0.0133},
            "modes": {"m": rate},
        },
    ]
    fig, ax = plt.subplots()
    draw_learning_curve(ax, points, "t")
    ticks = [label.get_text() for label in ax.get_xticklabels()]
    assert ticks == [
        "base\nstart",
        "round 0\nkept out\nval. +8/-2, p=0.055",
        "round 1\npromoted\nval. +16/-5, p=0.013",
    ]
    faces = [
        line.get_markerfacecolor()
        for line in ax.get_lines()
        if line.get_marker() == "o" and len(line.get_xdata()) == 1
    ]
    assert faces.count("white") == 1 and len(faces) == 3
    chain = [line for line in ax.get_lines() if len(line.get_xdata()) == 2]
    assert len(chain) == 1  # the line joins the start and the promoted round, not the kept out
    plt.close(fig)


def test_a_mode_keeps_its_colour_in_every_panel_of_a_figure() -> None:
    """The results page's figure: a mode that a later panel draws beside other modes (the
    search modes in the fourth) has the colour it has in the first panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from codeq.report.plots import draw_learning_curve, mode_colors

    rate = {"n": 60, "solved": 6, "solve_rate": 0.1, "ci_low": 0.05, "ci_high": 0.2}
    first = [
        {"label": "base", "promoted": None, "validation": None, "modes": {"a": rate, "b": rate}}
    ]
    second = [
        {"label": "base", "promoted": None, "validation": None, "modes": {"c": rate, "b": rate}}
    ]
    colors = mode_colors(first + second)
    assert colors == {"a": "C0", "b": "C1", "c": "C2"}
    fig, ax = plt.subplots()
    draw_learning_curve(ax, second, "t", colors)
    drawn = {
        text.get_text(): handle.get_color()
        for handle, text in zip(
            ax.get_legend().legend_handles, ax.get_legend().get_texts(), strict=True
        )
    }
    assert drawn["b"] == "C1" and drawn["c"] == "C2"  # alone, this panel would give b C1, c C0
    plt.close(fig)


def test_the_report_stage_draws_every_round_of_the_run(tmp_path) -> None:
    """Round 1's report: the run's start, round 0's promoted candidate and round 1's kept-out
    one, read from the store's earlier round and this one."""
    from test_rerun import POLICY

    from codeq.config import StoreConfig, load_config
    from codeq.pipeline.stages import StageContext, report_stage
    from codeq.schemas import AdapterLink
    from codeq.store import RoundLayout, open_store

    store = open_store(StoreConfig(uri=f"file://{tmp_path / 'store'}"))
    first = POLICY.extended(AdapterLink(round=0, sha256="b" * 64, source="r0"))
    second = first.extended(AdapterLink(round=1, sha256="c" * 64, source="r1"))
    rounds = [  # incumbent, candidate, validation per task (candidate, incumbent), test solved
        (POLICY, first, {"v1": (True, False), "v2": (True, True)}, ({"t1": True}, {"t1": False})),
        (first, second, {"v1": (True, True), "v2": (True, True)}, ({"t1": False}, {"t1": True})),
    ]
    for number, (incumbent, candidate, validation, (test_new, test_old)) in enumerate(rounds):
        layout, folder = RoundLayout("default", number), tmp_path / f"round-{number}"
        for role, policy, index, test in (
            ("candidate", candidate, 0, test_new),
            ("incumbent", incumbent, 1, test_old),
        ):
            solved = {task: pair[index] for task, pair in validation.items()}
            write_json(
                folder / "eval" / role / "validation" / "results.json",
                eval_results("validation", solved, policy),
            )
            write_json(
                folder / "eval" / role / "test" / "results.json", eval_results("test", test, policy)
            )
        made = decision(validation, 0.6, number, (candidate, incumbent))
        write_json(folder / "promote" / "decision.json", made.model_dump(mode="json"))
        write_json(folder / "pairs" / "stats.json", PAIR_STATS)
        write_json(folder / "adapter" / "metrics.json", TRAIN_METRICS)
        for stage in ("eval", "promote", "pairs", "adapter"):
            store.put_dir(layout.stage(stage), folder / stage)
            store.mark_complete(layout.stage(stage), {})
    config = load_config(overrides={"store": {"uri": store.uri, "round": 1}})
    report_stage(StageContext(config=config, store=store, scratch=tmp_path / "scratch"))

    target = tmp_path / "out" / "report.json"
    assert store.get_verified_file(RoundLayout("default", 1).stage("report"), "report.json", target)
    curve = json.loads(target.read_text())["learning_curve"]
    assert [(p["label"], p["promoted"]) for p in curve] == [
        ("before round 0", None),
        ("round 0", True),
        ("round 1", False),
    ]
    assert [p["modes"]["full_rewrite"]["solved"] for p in curve] == [0, 1, 0]
    assert curve[1]["validation"] == {"gained": 1, "lost": 0, "p_better": 0.5}
    markdown = tmp_path / "out" / "report.md"
    assert store.get_verified_file(RoundLayout("default", 1).stage("report"), "report.md", markdown)
    assert "| round 1 | kept out (+0 / -0, p = 1.0000) | 0/1, 0.0%" in markdown.read_text()
    html = tmp_path / "out" / "index.html"
    assert store.get_verified_file(RoundLayout("default", 1).stage("report"), "index.html", html)
    assert 'alt="Learning curve across rounds"' in html.read_text()


def test_a_sign_flip_decision_is_explained_by_its_pass_counts() -> None:
    """With promotion.samples the gate compares pass counts: the advice counts tasks where the
    candidate passes more answers, and does not quote McNemar's arithmetic."""
    from codeq.report.advice import what_next

    gate = {
        "mode": "full_rewrite",
        "tasks": 143,
        "candidate_solved": 30,
        "incumbent_solved": 28,
        "gained": ["a", "b", "c"],
        "lost": ["d"],
        "p_better": 0.21,
        "p_worse": 0.84,
        "test": "sign_flip",
        "pass_counts": {
            "samples": 8,
            "answers": 1287,
            "candidate_passes": 300,
            "incumbent_passes": 280,
            "tasks_better": 12,
            "tasks_worse": 8,
        },
    }
    promotion = {"round": 1, "promote": False, "level": 0.05, "samples": 8, "comparisons": [gate]}
    (text,) = what_next({"promotion": promotion})
    assert "cannot tell a gain this small from chance" in text
    assert "with 8 sampled answers per task, more passes on 12 tasks and fewer on 8" in text
    assert "would have to be gains" not in text and "promotion.samples" not in text


def test_a_round_kept_out_by_the_reach_guard_says_what_it_reaches() -> None:
    """A decision the reach guard blocked: the advice names the tasks reached, not chance."""
    from codeq.report.advice import what_next

    counts = {"samples": 8, "answers": 1287, "candidate_passes": 348, "incumbent_passes": 313}
    reach = {"candidate": 50, "incumbent": 69, "gained": 2, "lost": 21, "p_worse": 1.1e-05}
    gate = {
        "mode": "full_rewrite",
        "tasks": 143,
        "candidate_solved": 39,
        "incumbent_solved": 41,
        "gained": ["a"],
        "lost": ["b", "c"],
        "p_better": 0.01,
        "p_worse": 0.99,
        "test": "sign_flip",
        "pass_counts": counts | {"tasks_better": 32, "tasks_worse": 28, "reach": reach},
    }
    promotion = {"round": 16, "promote": False, "level": 0.05, "samples": 8, "comparisons": [gate]}
    (unguarded,) = what_next({"promotion": promotion})
    assert "reach_guard" not in unguarded
    (text,) = what_next({"promotion": promotion | {"reach_guard": True}})
    assert text.startswith("Not promoted: some answer of the candidate passes on 50 ")
    assert "against the incumbent's 69 (+2 / -21, p = 1.1e-05)" in text


def test_a_curve_round_decided_on_pass_counts_shows_that_test_s_counts(tmp_path) -> None:
    """A round decided with promotion.samples is marked on the learning curve by the tasks
    where the candidate passes more and fewer of its answers and the sign-flip p, not by its
    greedy gained / lost beside a p they did not give."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from test_rerun import POLICY

    from codeq.evaluate.results import EvalResults, SampledPasses
    from codeq.promotion import compare_modes, gate_figures
    from codeq.report.plots import draw_learning_curve, p_text

    tasks = [f"t{i}" for i in range(20)]
    greedy = {"candidate": {"t0", "t1"}, "incumbent": {"t1", "t2"}}
    passes = {"candidate": {t: 3 if i < 6 else 0 for i, t in enumerate(tasks)}, "incumbent": {}}
    passes["incumbent"] = {t: 1 if i < 6 else 0 for i, t in enumerate(tasks)}
    modes = {}
    for role in ("candidate", "incumbent"):
        solved = {t: t in greedy[role] for t in tasks}
        mode = EvalResults.model_validate(eval_results("validation", solved, POLICY))
        result = mode.modes["full_rewrite"]
        result.sampled = SampledPasses(
            samples=4, temperature=0.8, top_p=0.95, per_task=passes[role], pass_rate=0.1
        )
        modes[role] = result
    gate = compare_modes("full_rewrite", modes["candidate"], modes["incumbent"], 4)
    figures = gate_figures(gate)
    assert figures == {"gained": 6, "lost": 0, "p_better": gate.p_better, "answers": 5}
    assert (len(gate.gained), len(gate.lost)) == (1, 1)  # greedy: no gain to show
    greedy_only = compare_modes("full_rewrite", modes["candidate"], modes["incumbent"])
    assert gate_figures(greedy_only) == {"gained": 1, "lost": 1, "p_better": 0.75}

    rate = {"n": 60, "solved": 6, "solve_rate": 0.1, "ci_low": 0.05, "ci_high": 0.2}
    points = [
        {"label": "base", "promoted": None, "validation": None, "modes": {"m": rate}},
        {"label": "round 0", "promoted": True, "validation": figures, "modes": {"m": rate}},
    ]
    fig, ax = plt.subplots()
    draw_learning_curve(ax, points, "t")
    ticks = [label.get_text() for label in ax.get_xticklabels()]
    assert (
        ticks[1]
        == f"round 0\npromoted\nval. +6/-0, p{p_text(gate.p_better)}\n(passes of 5 answers)"
    )
    plt.close(fig)

    adapter = results("smollm2", {"a": True, "b": True, "c": False}, "round-0/adapter")
    render_report(tmp_path / "report", results=adapter, learning_curve=points)
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| round 0 | promoted (+6 / -0 tasks by passes of 5 answers each, p = " in markdown
