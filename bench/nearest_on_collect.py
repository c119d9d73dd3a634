"""Does the rewrite nearest the buggy program pass all tests more often than another choice, on
trees no decision uses? Reads a curve's collect trees (train tasks, where every program ran on
all its task's tests), and per tree takes the distinct valid rewrites tied at the top on the
visible tests (the first len(visible_tests) outcomes of each verdict); among the trees where
those mix programs passing all tests with programs failing a hidden one, it counts how often
each choice passes all tests: the nearest by characters (codeq.search.nearest.change_from),
by code lines and by tokens, the farthest, the self-critique's highest Q_ai, and a random
choice's expectation. No model, no sandbox: the verdicts the collection recorded.

    python bench/nearest_on_collect.py --store /work/curve-defaults/store \
        --run curve-lr0.0001 --rounds 0-16 \
        --json docs/results/answer-selection/collect-trees/nearest.json

What it motivated (the answer-selection README's fourth run) is decided on validation, not here.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tokenize
from collections.abc import Callable
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.schemas import Task, Trajectory, read_jsonl  # noqa: E402
from codeq.search.nearest import change_from  # noqa: E402


def code_lines(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if line.strip()]


def code_tokens(source: str) -> list[str]:
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT}
    skipped |= {tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        found = tokenize.generate_tokens(io.StringIO(source).readline)
        return [token.string for token in found if token.type not in skipped]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()


def changed(split: Callable[[str], list[str]]) -> Callable[[str, str], float]:
    """How many items of `split` a rewrite replaced, inserted or deleted."""

    def distance(buggy: str, program: str) -> float:
        matcher = SequenceMatcher(None, split(buggy), split(program), autojunk=False)
        return sum(
            max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
        )

    return distance


DISTANCES = {
    "characters": change_from,
    "lines": changed(code_lines),
    "tokens": changed(code_tokens),
}


def visible_ties(tree: Trajectory, visible: int) -> dict[str, tuple[bool, float]]:
    """program -> (passes all tests, Q_ai) for the distinct valid rewrites that pass the most
    visible tests."""
    found: dict[str, tuple[float, bool, float]] = {}
    for node in tree.nodes[1:]:
        verdict = node.verdict
        if not node.valid or verdict is None or len(verdict.tests) < visible:
            continue
        passed_visible = sum(outcome.passed for outcome in verdict.tests[:visible]) / visible
        found.setdefault(node.program, (passed_visible, verdict.passed, node.q_ai or 0.0))
    if not found:
        return {}
    top = max(value[0] for value in found.values())
    return {program: value[1:] for program, value in found.items() if value[0] == top}


def share_passing(chosen: list[str], tied: dict[str, tuple[bool, float]]) -> float:
    """The chance that a choice among `chosen` (all equally ranked) passes all tests."""
    return sum(tied[program][0] for program in chosen) / len(chosen)


def best_by(tied: dict[str, tuple[bool, float]], key: Callable[[str], float]) -> list[str]:
    best = max(key(program) for program in tied)
    return [program for program in tied if key(program) == best]


def measure(store: Path, run: str, rounds: list[int]) -> dict[str, Any]:
    counts: dict[str, float] = {"mixed ties": 0, "random": 0.0, "critique": 0.0, "farthest": 0.0}
    counts |= {f"nearest by {name}": 0.0 for name in DISTANCES}
    trees = 0
    for number in rounds:
        folder = store / "runs" / run / f"round-{number}"
        tasks = {task.task_id: task for task in read_jsonl(folder / "tasks" / "train.jsonl", Task)}
        for path in sorted((folder / "trajectories").glob("shard-*/trajectories.jsonl")):
            for tree in read_jsonl(path, Trajectory):
                trees += 1
                task = tasks[tree.task_id]
                if tree.reward_tests != "all" or not task.visible_tests:
                    continue
                tied = visible_ties(tree, len(task.visible_tests))
                passing = sum(passes for passes, _ in tied.values())
                if len(tied) < 2 or passing in (0, len(tied)):
                    continue
                counts["mixed ties"] += 1
                counts["random"] += passing / len(tied)
                counts["critique"] += share_passing(best_by(tied, lambda p, t=tied: t[p][1]), tied)
                buggy = task.buggy_code
                for name, distance in DISTANCES.items():
                    nearest = best_by(tied, lambda p, d=distance, b=buggy: -d(b, p))
                    counts[f"nearest by {name}"] += share_passing(nearest, tied)
                farthest = best_by(tied, lambda p, b=buggy: change_from(b, p))
                counts["farthest"] += share_passing(farthest, tied)
    return {"trees": trees, "passes_all_tests": {k: round(v, 2) for k, v in counts.items()}}


def round_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="a local store folder")
    parser.add_argument("--run", default="curve-lr0.0001", help="the curve's run in the store")
    parser.add_argument("--rounds", type=round_range, default="0-16", help="e.g. 0-16")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args(argv)
    result = {"command": "python bench/nearest_on_collect.py " + " ".join(sys.argv[1:])}
    result |= measure(args.store, args.run, args.rounds)
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
