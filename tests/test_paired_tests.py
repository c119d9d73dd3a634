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
