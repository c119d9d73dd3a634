"""Execution agreement as a tie-break: among the rewrites that pass the most reward tests, the
behaviour most of them share on probe inputs comes first (`codeq.tasks.probes`), and another
tie-break (the learned verifier, or the self-critique) orders what agreement leaves tied."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from codeq.schemas import Node, Task, tied_at_top
from codeq.search.tree import TieBreak, critique_tie_break
from codeq.tasks.probes import behaviour_groups, behaviours, probe_calls

if TYPE_CHECKING:
    from codeq.sandbox import Sandbox


ANSWERED_FIRST = True  # docs/results/answer-selection: adopted by its second declared rule


def ranking_of(answered_first: bool) -> str:
    """How agreement orders behaviours, in words (eval/verifier.json, the round report)."""
    return "answered probes, then group size" if answered_first else "group size"


def squash(score: float) -> float:
    """Any real score mapped into (0, 1), order kept: what keeps `then`'s scores below one
    agreeing program's worth."""
    return 0.5 + math.atan(score) / math.pi


class AgreementTieBreak:
    """A `codeq.search.tree.TieBreak`. Where two or more distinct programs pass the most reward
    tests, each is run on `probes` probe inputs of its task, and a rewrite's score is how many
    of those tied rewrites (repeated samples counted, as AlphaCode counts a cluster) answered
    every probe as it did, plus `then`'s score squashed into (0, 1): agreement decides, `then`
    orders equal groups and breaks ties inside one. With `answered_first`, a behaviour that
    answered more probes ranks above any that answered fewer, whatever their sizes: programs
    that raise or time out alike do not outvote those that answer (a probe is made like a
    hidden-test input, so a raise is evidence against a program). Elsewhere `then` alone. Each
    task's tied set is run once, however often the evaluation's budgets ask again."""

    def __init__(
        self,
        sandbox: Sandbox,
        probes: int,
        seed: int,
        then: TieBreak = critique_tie_break,
        answered_first: bool = ANSWERED_FIRST,
    ) -> None:
        self.sandbox, self.probes, self.seed, self.then = sandbox, probes, seed, then
        self.answered_first = answered_first
        self.decided = 0  # calls in which agreement ranked two or more distinct programs
        self.probed = 0  # of them, the calls whose task had probe inputs
        # (task id, tied programs) -> each program's group and how many probes it answered
        self.cache: dict[tuple[str, tuple[str, ...]], dict[str, tuple[int, int]]] = {}
        self.no_probes: set[str] = set()  # tasks whose examples give no probe input
        then_name = getattr(then, "__qualname__", type(then).__name__)
        # names it in evaluation resume keys (codeq.evaluate.run reads a tie-break's qualname)
        ranking = "answered-" if answered_first else ""
        self.__qualname__ = f"agreement-{ranking}{probes}-{seed}-{then_name}"

    def __call__(self, task: Task, nodes: Sequence[Node]) -> list[float]:
        inner = self.then(task, nodes)
        if not nodes:
            return inner
        tied = tied_at_top(nodes)
        programs = tuple(sorted({node.program for node in tied}))
        if len(programs) < 2:
            return inner
        self.decided += 1
        agreeing = self.agreement_scores(task, programs, [node.program for node in tied])
        if agreeing is None:
            return inner
        self.probed += 1
        at_top = {id(node) for node in tied}
        return [
            agreeing[node.program] + squash(score) if id(node) in at_top else score
            for node, score in zip(nodes, inner, strict=True)
        ]

    def agreement_scores(
        self, task: Task, programs: tuple[str, ...], samples: list[str]
    ) -> dict[str, int] | None:
        """program -> how many of `samples` (the tied rewrites' programs, repeats included)
        behave as it does on the probes, ranked first (with `answered_first`) by how many
        probes that behaviour answered; None when the task has no probe inputs."""
        key = (task.task_id, programs)
        if key not in self.cache:
            if task.task_id in self.no_probes:
                return None
            calls = probe_calls(task, self.probes, self.seed)
            if not calls:
                self.no_probes.add(task.task_id)
                return None
            answers = behaviours(task, programs, calls, self.sandbox)
            check = task.visible_tests[0].check if task.visible_tests else {}
            groups = behaviour_groups(answers, check)
            answered = [sum(answer.status == "ok" for answer in row) for row in answers]
            self.cache[key] = dict(zip(programs, zip(groups, answered, strict=True), strict=True))
        group_of = self.cache[key]
        weight: dict[int, int] = {}
        for program in samples:
            group = group_of[program][0]
            weight[group] = weight.get(group, 0) + 1
        rank = len(samples) + 1 if self.answered_first else 0  # above any group's size
        return {
            program: rank * group_of[program][1] + weight[group_of[program][0]]
            for program in programs
        }
