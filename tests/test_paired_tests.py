"""bench/paired_tests.py, the ledger of paired tests per split: every entry agrees with the
committed result files it names, every committed result file is in the ledger, and the counts
in docs/results/paired-tests.md and docs/results.md are the script's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from test_bench import load_bench

REPO = Path(__file__).resolve().parent.parent
# load_bench registers it in sys.modules: its dataclasses look their module up while it loads
paired_tests = load_bench("paired_tests")


def checked():
    entries = paired_tests.ledger()
    backings, problems = paired_tests.check_all(entries)
    return entries, backings, problems


def test_every_entry_agrees_with_the_committed_files() -> None:
    _, backings, problems = checked()
    assert problems == []
    # all but the learning-rate check (counts only) are checked task by task
    loose = sorted(key for key, how in backings.items() if how not in paired_tests.TASK_BY_TASK)
    assert loose == ["V4", "V5"]


def test_the_ledger_page_and_the_front_page_hold_the_scripts_counts() -> None:
    entries, backings, _ = checked()
    page = (REPO / "docs" / "results" / "paired-tests.md").read_text()
    for name, body in paired_tests.blocks(entries, backings).items():
        block = re.search(
            rf"<!-- paired_tests.py {name} -->\n(.*?)\n<!-- /paired_tests.py {name} -->",
            page,
            re.DOTALL,
        )
        assert block is not None, name
        assert block.group(1) == body.rstrip(), (
            f"docs/results/paired-tests.md's {name} are stale: run "
            ".venv/bin/python bench/paired_tests.py --write docs/results/paired-tests.md"
        )
    front = (REPO / "docs" / "results.md").read_text()
    section = front.split("## Paired tests per split", 1)[1].split("\n## ", 1)[0]
    assert paired_tests.counts_table(entries, backings) in section, (
        "docs/results.md's 'Paired tests per split' table is not the one "
        "bench/paired_tests.py prints"
    )


def test_a_wrong_figure_split_or_p_is_caught() -> None:
    sets = paired_tests.task_sets()
    entry = next(x for x in paired_tests.LEDGER if x.key == "T137-2")  # +6 / -0, p = 0.016
    assert paired_tests.check_entry(entry, sets)[1] == []
    wrong = [
        dataclasses.replace(entry, gained=5),
        dataclasses.replace(entry, p="0.16"),
        dataclasses.replace(entry, split="test60", tasks=60),  # the files hold the other 137
    ]
    for bad in wrong:
        assert paired_tests.check_entry(bad, sets)[1], bad


def test_a_result_file_no_entry_uses_is_reported() -> None:
    entries = [
        x
        for x in paired_tests.ledger()
        if not any("validation-40-refine" in spec for spec in x.first + x.second)
    ]
    _, problems = paired_tests.check_all(entries)
    assert any(p.startswith("prompt-ab/validation-40-refine.json: a result file") for p in problems)


def test_a_round_decided_on_sampled_answers_is_checked_by_its_sign_flip_p(
    tmp_path, monkeypatch
) -> None:
    """An entry decided with promotion.samples keeps the greedy gained / lost, and its p is
    the sign-flip test's on the pass counts the two files hold, not McNemar's."""
    from test_promote import BASE, CANDIDATE, sampled_results

    from codeq.promotion import one_sided_mcnemar

    task_ids = paired_tests.task_sets()[("validation", 40)]
    greedy_new = {t: i in (0, 1, 2, 5, 6) for i, t in enumerate(task_ids)}
    greedy_old = {t: i in (3, 5, 6) for i, t in enumerate(task_ids)}
    new_passes = {t: (4 if i < 12 else 0) for i, t in enumerate(task_ids)}
    old_passes = {t: (1 if i < 12 else 0) for i, t in enumerate(task_ids)}
    for name, policy, greedy, passes in (
        ("candidate.json", CANDIDATE, greedy_new, new_passes),
        ("incumbent.json", BASE, greedy_old, old_passes),
    ):
        results = sampled_results("validation", policy, greedy, passes, 8)
        (tmp_path / name).write_text(results.model_dump_json())
    sets = paired_tests.task_sets()  # read from the real files before the folder moves
    monkeypatch.setattr(paired_tests, "RESULTS", tmp_path)
    paired_tests.read.cache_clear()
    paired_tests.pass_count_test.cache_clear()
    try:
        entry = paired_tests.e(
            "V-x",
            "validation",
            40,
            "2026-11-29",
            "a sampled round",
            (3, 1),
            p="< 0.001",
            first=("candidate.json:full_rewrite",),
            second=("incumbent.json:full_rewrite",),
            samples=8,
        )
        assert paired_tests.check_entry(entry, sets)[1] == []
        assert paired_tests.p_text(entry) == "< 0.001"
        mcnemar = f"{one_sided_mcnemar(3, 1):.3g}"
        as_greedy = dataclasses.replace(entry, p=mcnemar)
        assert paired_tests.check_entry(as_greedy, sets)[1]  # the sign-flip p is far smaller
        assert paired_tests.check_entry(dataclasses.replace(as_greedy, samples=0), sets)[1] == []
    finally:
        paired_tests.read.cache_clear()
        paired_tests.pass_count_test.cache_clear()


def test_result_files_packed_with_xz_are_in_the_ledger_too() -> None:
    """A committed round keeps a large results.json as results.json.xz (curve_rounds.pack): it
    is read and must be in the ledger like any other result file."""
    listed = set(paired_tests.result_files())
    packed = sorted(paired_tests.RESULTS.rglob("results.json.xz"))
    assert packed  # validation results with sampled answers (round 11 of the third curve on)
    for path in packed:
        assert path.relative_to(paired_tests.RESULTS).as_posix().removesuffix(".xz") in listed
