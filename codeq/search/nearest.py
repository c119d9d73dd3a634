"""The smallest repair first, as a tie-break: among rewrites that pass as many reward tests, the
one that changes the buggy program least comes first, and another tie-break (the learned
verifier, or the self-critique) orders what that leaves equal.

Why: a DebugBench bug is a small edit of a correct program, and program repair has long found
that of two patches passing the same tests the smaller one more often is the correct one (a
larger rewrite has more room to fit the visible tests and break what they do not test). On the
third curve's collect trees (train tasks only, every test run) the nearest of the visible-tests
ties passes all tests in 32 of 53 mixed ties, against 24.5 for a random choice and 22.7 for the
self-critique's (bench/nearest_on_collect.py). On validation it did not beat the verifier as
the order of agreement's equal groups (+1 / -1 on best-of-16's trees), so it is measured, not
a default (docs/results/answer-selection/README.md, fourth run)."""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

from codeq.schemas import Node, Task
from codeq.search.agreement import squash
from codeq.search.tree import TieBreak, critique_tie_break

STEPS = 10_000  # nearness is compared in steps of 1 / STEPS; closer than that is equal


def change_from(buggy: str, program: str) -> float:
    """How much of `buggy` a rewrite changed, in [0, 1]: one minus the characters' similarity
    ratio (difflib, without its junk heuristic, so that long programs are compared whole)."""
    return 1.0 - SequenceMatcher(None, buggy, program, autojunk=False).ratio()


class NearestTieBreak:
    """A `codeq.search.tree.TieBreak`: each rewrite's nearness to its task's buggy program in
    steps of 1 / STEPS, plus `then`'s score squashed into (0, 1), so nearness decides and `then`
    orders rewrites equally near. Each (task, program) is measured once."""

    def __init__(self, then: TieBreak = critique_tie_break) -> None:
        self.then = then
        self.changes: dict[tuple[str, str], float] = {}
        then_name = getattr(then, "__qualname__", type(then).__name__)
        # names it in evaluation resume keys (codeq.evaluate.run reads a tie-break's qualname)
        self.__qualname__ = f"nearest-{then_name}"

    def __call__(self, task: Task, nodes: Sequence[Node]) -> list[float]:
        inner = self.then(task, nodes)
        return [
            self.nearness(task, node.program) + squash(score)
            for node, score in zip(nodes, inner, strict=True)
        ]

    def nearness(self, task: Task, program: str) -> int:
        key = (task.task_id, program)
        if key not in self.changes:
            self.changes[key] = change_from(task.buggy_code, program)
        return int((1.0 - self.changes[key]) * STEPS)
