"""bench/curve_figure.py on the committed result files: the figures docs/results.md's front page
quotes come out of the per-task files, and the figure is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_bench import load_bench

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "results"


curve_figure = load_bench("curve_figure")


def test_the_whole_split_curve_promotes_round_1_on_validation_and_gains_on_test() -> None:
    rows = curve_figure.load_curve(RESULTS / "learning-curve-whole")
    assert [(row["label"], row["promoted"]) for row in rows] == [
        ("base model", None),
        ("round 0", False),
        ("round 1", True),
    ]
    round_1 = rows[2]
    validation = round_1["validation_vs"]  # from the per-task files of round-1-evaluate/
    assert (validation.candidate_solved, validation.incumbent_solved, validation.tasks) == (
        33,
        22,
        143,
    )
    assert (len(validation.gained), len(validation.lost)) == (16, 5)
    assert round_1["validation_source"] == "round-1-evaluate/*-validation.json"
    assert round_1["incumbent"] == "base"
    test = round_1["test_vs"]["full_rewrite"]
    assert (test.candidate_solved, test.incumbent_solved, len(test.gained), len(test.lost)) == (
        13,
        4,
        10,
        1,
    )
    assert round(test.p_better, 4) == 0.0059


def test_the_first_curve_table_and_the_other_tables() -> None:
    rows = curve_figure.load_curve(RESULTS / "learning-curve")
    table = curve_figure.curve_table(rows)
    assert "| round 0: **promoted** | 9 / 40 (22%, 12%–38%); +5 / -0 vs base, p = 0.031 |" in table
    assert "13 / 60 (22%, 13%–34%); +6 / -0 vs round 0, p = 0.016" in table  # round 2, kept out
    search = curve_figure.search_table(curve_figure.search_rows(RESULTS))
    assert "| base model, the curves' search | 11 / 60" in search and "+1 / -8" in search
    replication = curve_figure.replication_table(curve_figure.replication_rows(RESULTS))
    assert "22 / 137 (16%, 11%–23%); +9 / -1 vs base, p = 0.011" in replication


def test_the_third_curve_comes_from_the_rounds_it_committed_to_git() -> None:
    """Read off rounds/round-N/store/ (each round's own evaluate output), not a summary."""
    rows = curve_figure.load_defaults_curve(RESULTS / "learning-curve-defaults")
    assert rows[0]["label"] == "base model" and rows[0]["results"].modes["full_rewrite"].n == 60
    by_round = {row["round"]: row for row in rows[1:]}
    assert [by_round[n]["promoted"] for n in range(4)] == [False, False, False, True]
    round_3 = by_round[3]
    validation = round_3["validation_vs"]
    assert (validation.candidate_solved, validation.incumbent_solved, validation.tasks) == (
        38,
        27,
        143,
    )
    assert (len(validation.gained), len(validation.lost)) == (16, 5)
    assert round_3["incumbent"] == "base"
    test = round_3["test_vs"]["full_rewrite"]
    assert (test.candidate_solved, len(test.gained), len(test.lost)) == (16, 8, 1)
    if 4 in by_round:  # the round after the promotion is paired against round 3's policy
        assert by_round[4]["incumbent"] == "round-3"
    assert "zero_shot" not in round_3["test_vs"]  # the curve's evaluate scores full_rewrite only


def test_points_mark_promotions_for_the_figure() -> None:
    points = curve_figure.curve_points(curve_figure.load_curve(RESULTS / "learning-curve"))
    assert [point["promoted"] for point in points] == [None, True, False, False]
    assert points[1]["validation"] == {"gained": 5, "lost": 0, "p_better": 0.03125}
    assert set(points[0]["modes"]) == {
        "full_rewrite",
        "zero_shot",
        "MCTS, 8 rollouts",
        "best-of-16",
    }
    assert set(points[3]["modes"]) == {"full_rewrite", "zero_shot"}  # round 2: no search modes


def test_the_command_prints_the_tables_and_writes_the_png(tmp_path) -> None:
    png = tmp_path / "curves.png"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "curve_figure.py"), "--png", str(png)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "| round 1: **promoted** | 33 / 143 (23%, 17%–31%); +16 / -5 vs base, p = 0.013 |" in (
        done.stdout
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (RESULTS / "learning-curves.png").is_file()  # the committed one, shown by results.md
    # the front page shows every table row the script prints, as printed
    page = (REPO / "docs" / "results.md").read_text()
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) > 15
    assert [row for row in rows if row not in page] == []


def test_the_widening_paragraph_s_8_rollout_figures_from_the_committed_files() -> None:
    """The notebook's widening paragraph, re-derived: MCTS with widening 0.5 at 8 rollouts
    against the base model's single passes on the same 60 test tasks (`--pair`)."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "compare_evals.py"),
            str(RESULTS / "widening" / "test-mcts-w0.5.json"),
            str(RESULTS / "learning-curve" / "base-test.json"),
            "--pair",
            "mcts@8",
            "zero_shot",
            "--pair",
            "mcts@8",
            "full_rewrite",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "| mcts@8 vs zero_shot | 60 | 14 | 9 | +7 / -2 (p = 0.0898) |" in done.stdout
    assert "| mcts@8 vs full_rewrite | 60 | 14 | 4 | +10 / -0 (p = 0.001) |" in done.stdout
    refused = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "compare_evals.py"),
            str(RESULTS / "widening" / "test-mcts-w0.5.json"),
            str(RESULTS / "learning-curve" / "base-test.json"),
            "--pair",
            "mcts@16",
            "zero_shot",
        ],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0
    assert "the first results have no figure 'mcts@16'" in refused.stderr


def test_the_third_curves_test_measurement_pairs_each_policy_with_its_predecessor() -> None:
    """The 137 other test tasks, measured once after the chain: round 3's promoted policy
    against the base model in both single-pass modes, on the same tasks; each later promoted
    policy against the one before it; every other row a kept-out candidate."""
    folder = RESULTS / "learning-curve-defaults"
    rows = curve_figure.load_test_measurement(folder, curve_figure.load_defaults_curve(folder))
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) >= {"base", "round-3"}
    base, round_3 = by_name["base"]["results"], by_name["round-3"]["results"]
    assert base.task_ids == round_3.task_ids and len(base.task_ids) == 137
    assert by_name["round-3"]["incumbent"] == "base" and by_name["round-3"]["promoted"]
    for mode in ("full_rewrite", "zero_shot"):
        paired = by_name["round-3"]["test_vs"][mode]
        assert paired.tasks == 137
        assert paired.candidate_solved == round_3.modes[mode].solved
        assert paired.incumbent_solved == base.modes[mode].solved
    chain = ["base", "round-3", "round-15", "round-16"]  # what the curve promoted, in order
    for earlier, later in zip(chain, chain[1:], strict=False):
        assert by_name[later]["promoted"] and by_name[later]["incumbent"] == earlier
    for row in rows:  # the others: candidates validation kept out, reported beside them
        if row["name"] not in chain:
            assert not row["promoted"] and row["file"] == f"{row['name']}-candidate-test.json"


def test_a_round_decided_on_pass_counts_is_quoted_with_its_sign_flip_test() -> None:
    """A round decided with promotion.samples: its validation cell gives the greedy tasks
    gained and lost, then the pass counts and the sign-flip p that decided it."""
    from codeq.promotion import ModeComparison, PassCounts

    sampled = ModeComparison(
        mode="full_rewrite",
        tasks=143,
        candidate_solved=41,
        incumbent_solved=38,
        gained=["a", "b", "c", "d", "e"],
        lost=["f", "g"],
        p_better=0.0312,
        p_worse=0.97,
        test="sign_flip",
        pass_counts=PassCounts(
            samples=8,
            answers=1287,
            candidate_passes=420,
            incumbent_passes=380,
            tasks_better=31,
            tasks_worse=20,
        ),
    )
    assert curve_figure.paired_text(sampled, "round 3") == (
        "; +5 / -2 vs round 3; 9 answers a task: 420 against 380 of 1287 pass, "
        "more on 31 tasks, fewer on 20, sign-flip p = 0.031"
    )
    worse = sampled.model_copy(
        update={"pass_counts": sampled.pass_counts.model_copy(update={"candidate_passes": 300})}
    )
    assert curve_figure.paired_text(worse, "round 3").endswith("sign-flip p worse = 0.97")
    greedy = sampled.model_copy(update={"test": "mcnemar", "pass_counts": None})
    assert curve_figure.paired_text(greedy, "round 3") == "; +5 / -2 vs round 3, p = 0.031"


def searched_like_single_pass(folder: Path, name: str, single: Any, task_ids: list[str]) -> None:
    """A search modes' test record for `name` whose three searches answer as its single pass
    did: real per-task outcomes, so that every pairing can be checked against the single
    pass's own."""
    from codeq.schemas import write_json

    full_rewrite = single.modes["full_rewrite"]
    results = single.model_copy(
        update={
            "task_ids": task_ids,
            "primary_mode": "mcts",
            "modes": dict.fromkeys(("bon", "mt_bon", "mcts"), full_rewrite),
        }
    )
    write_json(folder / f"{name}-test-results.json", results.model_dump(mode="json"))
    search = {"bon_samples": 16, "mt_bon_samples": 4, "mt_bon_turns": 4, "rollouts": 8}
    write_json(
        folder / f"{name}-test.json", {"results": f"{name}-test-results.json", "search": search}
    )


def test_the_search_modes_test_run_pairs_each_promoted_policy_with_its_predecessor(
    tmp_path,
) -> None:
    """Only the policies the chain went on from are read, each search paired with the same
    search of the policy its round was meant to replace; a run not finished is left out, and
    one on other tasks than the single pass is refused."""
    folder = RESULTS / "learning-curve-defaults"
    measurement = curve_figure.load_test_measurement(
        folder, curve_figure.load_defaults_curve(folder)
    )
    by_name = {row["name"]: row for row in measurement}
    for name in ("base", "round-3", "round-4"):  # round 4: kept out, never searched on test
        single = by_name[name]["results"]
        searched_like_single_pass(tmp_path, name, single, single.task_ids)
    rows = curve_figure.load_search_test_run(tmp_path, measurement)
    assert [row["name"] for row in rows] == ["base", "round-3"]  # round 15's run: not there
    base, round_3 = rows
    assert base["search_vs"] == {}
    single_pass = round_3["test_vs"]["full_rewrite"]  # +21 / -7 on 137 tasks
    for mode in ("bon", "mt_bon", "mcts"):
        paired = round_3["search_vs"][mode]
        assert (paired.tasks, paired.gained, paired.lost) == (
            137,
            single_pass.gained,
            single_pass.lost,
        )
    names = curve_figure.short_names(measurement)
    table = curve_figure.search_test_table(rows, names)
    assert (
        "| policy | single pass, full_rewrite | best-of-16 | multi-turn best-of-4, 4 turns | MCTS, 8 rollouts |"
        in table
    )
    assert (
        "| round 3: **promoted** | 38 / 137 (28%, 21%–36%); +21 / -7 vs base, p = 0.006 |" in table
    )
    assert "38 / 137 (28%, 21%–36%), 1.0 programs a task; +21 / -7 vs base, p = 0.006" in table
    points = curve_figure.measurement_points(measurement, rows)
    assert len(points) == len(measurement)
    assert set(points[0]["modes"]) == {
        "full_rewrite",
        "best-of-16",
        "multi-turn best-of-4, 4 turns",
        "MCTS, 8 rollouts",
    }
    assert set(points[1]["modes"]) == {"full_rewrite"}  # round 0, kept out: single pass only
    # round 16's run finished before round 15's: its single pass is still paired with round
    # 15 by name, its searches with nothing yet
    single = by_name["round-16"]["results"]
    searched_like_single_pass(tmp_path, "round-16", single, single.task_ids)
    rows = curve_figure.load_search_test_run(tmp_path, measurement)
    assert [row["name"] for row in rows] == ["base", "round-3", "round-16"]
    assert rows[-1]["search_vs"] == {}
    last = curve_figure.search_test_table(rows, names).splitlines()[-1]
    assert last.startswith("| round 16: **promoted** | ") and "vs round 15, p" in last, last
    assert "vs None" not in last and last.count(" vs ") == 1, last
    single = by_name["round-3"]["results"]
    searched_like_single_pass(tmp_path, "round-3", single, single.task_ids[:-1])
    with pytest.raises(
        ValueError, match="round-3-test.json searched other tasks than round-3-test.json"
    ):
        curve_figure.load_search_test_run(tmp_path, measurement)
