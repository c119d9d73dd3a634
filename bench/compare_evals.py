"""Two `codeq evaluate` results on the same tasks, paired: for every mode and every MCTS rollout
budget or best-of-N sample count that both measured, the tasks each solved, the tasks the first
gained and lost against the second, and the exact one-sided McNemar p that the first is better.

    python bench/compare_evals.py one_turn/results.json multi_turn/results.json
    python bench/compare_evals.py a.json b.json --json comparison.json
    # MCTS at b rollouts (first) against best-of-(K*b) (second), the most programs b rollouts of
    # K rewrites each can write
    python bench/compare_evals.py mcts/results.json bon/results.json --mcts-vs-bon 2
    # any two named figures: the first's MCTS at 8 rollouts against the second's zero_shot
    python bench/compare_evals.py mcts/results.json base/results.json --pair mcts@8 zero_shot
    # multi-turn best-of-N (8 samples a turn, 3 turns) against best-of-24, in one evaluation
    python bench/compare_evals.py eval/results.json eval/results.json --pair mt_bon@8x3 bon@24

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


def headline_name(mode: str, figure: dict[str, Any]) -> str:
    """A search mode's headline figure's name, by its budget ('mcts@8', 'bon@16',
    'mt_bon@4x4'); a mode without one keeps its own name ('zero_shot')."""
    if mode == "mt_bon":
        return f"mt_bon@{figure['samples']}x{figure['rollouts']}"
    if figure.get("rollouts"):
        return f"mcts@{figure['rollouts']}"
    if figure.get("samples"):
        return f"bon@{figure['samples']}"
    return mode


def figures(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every figure a results.json holds, by name: 'zero_shot', 'mcts@4', 'bon@16', 'mt_bon@8x3'
    (multi-turn best-of-N: N samples a turn, t turns), ... A search mode's headline figure is
    named by its budget, so that two results searched with different rollouts (or samples) are
    not paired under the one name 'mcts' (or 'bon')."""
    named = {
        headline_name(mode, figure): figure for mode, figure in results.get("modes", {}).items()
    }
    for budget, figure in results.get("mcts_rollout_ablation", {}).items():
        named[f"mcts@{budget}"] = figure
    for samples, figure in results.get("bon_ablation", {}).items():
        named[f"bon@{samples}"] = figure
    for turns, figure in results.get("mt_bon_ablation", {}).items():
        named[f"mt_bon@{figure['samples']}x{turns}"] = figure
    return named


def mcts_against_bon(
    first: dict[str, Any], second: dict[str, Any], rewrites: int
) -> list[tuple[str, str]]:
    """The first's MCTS at each budget b against the second's best-of-N with N = rewrites * b."""
    theirs = figures(second)
    budgets = sorted(int(b) for b in first.get("mcts_rollout_ablation", {}))
    pairs = [(f"mcts@{b}", f"bon@{b * rewrites}") for b in budgets]
    return [(mine, other) for mine, other in pairs if other in theirs]


def compare(
    first: dict[str, Any], second: dict[str, Any], pairs: list[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    """Paired rows for `pairs` of figure names (first's, second's); by default every figure both
    measured."""
    if first.get("task_ids") != second.get("task_ids") or first.get("split") != second.get("split"):
        raise SystemExit(
            "error: the two results are not on the same tasks; hint: evaluate both on the same "
            "tasks file with the same --max-tasks"
        )
    mine, theirs = figures(first), figures(second)
    rows = []
    if pairs is None:
        pairs = [(name, name) for name in mine if name in theirs]
    for name, other in pairs:
        for wanted, held, which in ((name, mine, "first"), (other, theirs, "second")):
            if wanted not in held:
                raise SystemExit(
                    f"error: the {which} results have no figure {wanted!r}; hint: it has "
                    + ", ".join(held)
                )
    for name, other in pairs:
        a, b = mine[name]["per_task"], theirs[other]["per_task"]
        gained = sum(bool(a[task]) and not b[task] for task in a)
        lost = sum(bool(b[task]) and not a[task] for task in a)
        rows.append(
            {
                "figure": name if name == other else f"{name} vs {other}",
                "tasks": len(a),
                "first": mine[name]["solved"],
                "second": theirs[other]["solved"],
                "gained": gained,
                "lost": lost,
                "p_first_better": round(one_sided_mcnemar(gained, lost), 4),
                "programs": [mine[name].get("programs"), theirs[other].get("programs")],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="results.json of the condition under test")
    parser.add_argument("second", type=Path, help="results.json it is compared against")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--mcts-vs-bon",
        type=int,
        metavar="K",
        help="pair the first's MCTS at b rollouts with the second's best-of-(K*b), K being "
        "search.rewrites_per_expansion",
    )
    parser.add_argument(
        "--pair",
        nargs=2,
        action="append",
        metavar=("FIRST", "SECOND"),
        help="pair the first's figure FIRST with the second's SECOND (e.g. mcts@8 zero_shot); "
        "repeat for more rows",
    )
    args = parser.parse_args()
    first, second = load(args.first), load(args.second)
    pairs = None if args.mcts_vs_bon is None else mcts_against_bon(first, second, args.mcts_vs_bon)
    if args.pair:
        pairs = (pairs or []) + [tuple(pair) for pair in args.pair]
    rows = compare(first, second, pairs)
    if not rows:
        hint = "the first needs MCTS budgets b and the second best-of-(K*b)"
        if pairs is None:
            hint = "evaluate the same --modes"
        raise SystemExit(f"error: the two results share no figure to pair; hint: {hint}")
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
