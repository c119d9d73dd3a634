"""After a third-curve round is committed under docs/results/learning-curve-defaults/rounds/,
regenerate what is computed from the committed files: the ledger page
(docs/results/paired-tests.md), the paired-test counts and the third curve's table on
docs/results.md, the figure, and what each round's DPO did to its policy
(learning-curve-defaults/round-training.md). The round's own paragraph is written by hand.
tests/test_paired_tests.py, tests/test_curve_figure.py and tests/test_round_training.py fail
until this has run.

    .venv/bin/python bench/results_page.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import curve_figure  # noqa: E402
import paired_tests  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "results.md"


def replace_table_after(text: str, marker: str, table: str) -> str:
    """`text` with the first markdown table after `marker` replaced by `table`."""
    first = text.index("\n|", text.index(marker)) + 1
    lines = text[first:].split("\n")
    count = next(i for i, line in enumerate(lines) if not line.startswith("|"))
    return text[:first] + table.strip() + text[first + len("\n".join(lines[:count])) :]


def main() -> None:
    script = Path(__file__).resolve().parent
    ledger = REPO / "docs" / "results" / "paired-tests.md"
    subprocess.run(
        [sys.executable, str(script / "paired_tests.py"), "--write", str(ledger)], check=True
    )
    entries = paired_tests.ledger()
    backings, problems = paired_tests.check_all(entries)
    if problems:
        raise SystemExit("error: " + "; ".join(problems))
    text = PAGE.read_text()
    counts = paired_tests.counts_table(entries, backings)
    text = replace_table_after(text, "## Paired tests per split", counts)
    folder = REPO / "docs" / "results" / "learning-curve-defaults"
    rows = curve_figure.load_defaults_curve(folder)
    text = replace_table_after(text, "**Third curve**", curve_figure.curve_table(rows))
    measured = curve_figure.load_test_measurement(folder, rows)
    if measured:
        table = curve_figure.curve_table(measured)
        text = replace_table_after(text, "**The third curve's test measurement**", table)
        searched = curve_figure.load_search_test_run(
            curve_figure.RESULTS / curve_figure.SEARCH_MODES, measured
        )
        if searched:
            table = curve_figure.search_test_table(searched, curve_figure.short_names(measured))
            text = replace_table_after(text, "**The third curve's policies searching**", table)
    PAGE.write_text(text)
    png = REPO / "docs" / "results" / "learning-curves.png"
    subprocess.run(
        [sys.executable, str(script / "curve_figure.py"), "--png", str(png)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [sys.executable, str(script / "round_training.py"), *ROUND_TRAINING_ARGS],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    print(
        f"rewrote {ledger.relative_to(REPO)}, {PAGE.relative_to(REPO)} tables, {png.name}, "
        f"{ROUND_TRAINING_ARGS[-1]}"
    )


# relative paths: the generated page names the command that made it
ROUND_TRAINING_ARGS = [
    "--rounds",
    "docs/results/learning-curve-defaults/rounds",
    "--markdown",
    "docs/results/learning-curve-defaults/round-training.md",
]


if __name__ == "__main__":
    main()
