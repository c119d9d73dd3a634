"""Two `codeq evaluate` results on the same tasks, paired: for every mode and every MCTS rollout
budget or best-of-N sample count that both measured, the tasks each solved, the tasks the first
gained and lost against the second, and the exact one-sided McNemar p that the first is better.

    python bench/compare_evals.py one_turn/results.json multi_turn/results.json
    python bench/compare_evals.py a.json b.json --json comparison.json

Results on different tasks (or a different split) are refused: a paired test needs the same
tasks in the same conditions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.promotion import one_sided_mcnemar  # noqa: E402


def load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"error: cannot read {path}: {exc}") from exc


def figures(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every figure a results.json holds, by name: 'mcts', 'mcts@4', 'bon@16', ..."""
    named = dict(results.get("modes", {}))
    for budget, figure in results.get("mcts_rollout_ablation", {}).items():
        named[f"mcts@{budget}"] = figure
    for samples, figure in results.get("bon_ablation", {}).items():
        named[f"bon@{samples}"] = figure
    return named


def compare(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    if first.get("task_ids") != second.get("task_ids") or first.get("split") != second.get("split"):
        raise SystemExit(
            "error: the two results are not on the same tasks; hint: evaluate both on the same "
            "tasks file with the same --max-tasks"
        )
    mine, theirs = figures(first), figures(second)
    rows = []
    for name in [name for name in mine if name in theirs]:
        a, b = mine[name]["per_task"], theirs[name]["per_task"]
        gained = sum(bool(a[task]) and not b[task] for task in a)
        lost = sum(bool(b[task]) and not a[task] for task in a)
        rows.append(
            {
                "figure": name,
                "tasks": len(a),
                "first": mine[name]["solved"],
                "second": theirs[name]["solved"],
                "gained": gained,
                "lost": lost,
                "p_first_better": round(one_sided_mcnemar(gained, lost), 4),
                "programs": [mine[name].get("programs"), theirs[name].get("programs")],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="results.json of the condition under test")
    parser.add_argument("second", type=Path, help="results.json it is compared against")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = compare(load(args.first), load(args.second))
    if not rows:
        raise SystemExit("error: the two results share no mode; hint: evaluate the same --modes")
    print(
        f"| figure | tasks | {args.first} | {args.second} | gained / lost (p) | programs a task |"
    )
    print("|---|---:|---:|---:|---|---|")
    for row in rows:
        programs = " / ".join("-" if p is None else f"{p:g}" for p in row["programs"])
        print(
            f"| {row['figure']} | {row['tasks']} | {row['first']} | {row['second']} | "
            f"+{row['gained']} / -{row['lost']} (p = {row['p_first_better']}) | {programs} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"first": str(args.first), "second": str(args.second), "rows": rows}, indent=1
            )
        )


if __name__ == "__main__":
    main()
