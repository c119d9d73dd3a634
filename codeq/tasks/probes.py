"""Probe inputs and what programs do on them: how candidate answers are compared by behaviour.

A probe is an input made the way prepare makes hidden-test inputs (seeded mutations of the
statement's examples, `codeq.tasks.synth`), from another seed and without an expected output:
nothing of a task's hidden tests is read. Running several candidate programs on the same
probes and grouping those that answer alike says which behaviour most candidates share, the
execution-agreement choice of AlphaCode's clustering and MBR-exec."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from codeq.schemas import Task, TestCase
from codeq.tasks.harness import EntryError, make_call
from codeq.tasks.literals import LiteralParseError, parse_example
from codeq.tasks.scoring import build_request, outputs_match
from codeq.tasks.synth import Mutator

if TYPE_CHECKING:
    from codeq.sandbox import Sandbox

PROBE_ATTEMPTS_PER_INPUT = 8  # mutation attempts per wanted probe (most succeed at once)


def probe_calls(task: Task, count: int, seed: int) -> list[dict[str, Any]]:
    """Up to `count` new harness calls for `task`: seeded mutations of its statement's
    examples, none equal to an example's input, with no expected output. A task whose
    examples do not parse (or whose entry cannot take a mutated input) has none."""
    try:
        examples = [parse_example(text) for text in task.examples]
    except LiteralParseError:
        return []
    if not examples or count <= 0:
        return []
    mutator = Mutator(examples, task.constraints, random.Random(f"probe:{seed}:{task.task_id}"))
    calls = []
    for candidate in mutator.candidates(count, count * PROBE_ATTEMPTS_PER_INPUT):
        try:
            calls.append(make_call(task.entry, candidate))
        except (EntryError, KeyError, TypeError):  # an entry that cannot take this input
            continue
    return calls


@dataclass(frozen=True)
class Answer:
    """What a program did on one probe: its value, or that it raised / timed out / did not
    run (`status`)."""

    status: str  # ok | error | not_run
    value: Any = None


def behaviours(
    task: Task, programs: Sequence[str], calls: Sequence[dict[str, Any]], sandbox: Sandbox
) -> list[list[Answer]]:
    """Each program's answers to `calls`, run in the sandbox with the task's per-call limit."""
    tests = [TestCase(call=call, expected=None, origin="generated") for call in calls]
    timeout = task.entry.get("call_timeout_s")
    results = sandbox.run_batch([build_request(p, tests, timeout) for p in programs])
    return [
        [_answer(call) for call in [*result.calls, *[None] * len(calls)][: len(calls)]]
        for result in results
    ]


def _answer(call: Any) -> Answer:
    if call is None:
        return Answer("not_run")
    return Answer("ok", call.value) if call.ok else Answer("error")


def same_behaviour(first: Sequence[Answer], second: Sequence[Answer], check: dict) -> bool:
    """Whether two programs answered every probe alike: equal statuses, and equal values
    (under the task's comparison options: float tolerance, unordered) where both answered."""
    return all(
        a.status == b.status and (a.status != "ok" or outputs_match(a.value, b.value, check))
        for a, b in zip(first, second, strict=True)
    )


def behaviour_groups(answers: Sequence[Sequence[Answer]], check: dict) -> list[int]:
    """Each program's group: programs join the first group whose first member answered every
    probe alike (groups numbered from 0 in order of their first member)."""
    leaders: list[int] = []
    groups: list[int] = []
    for answer in answers:
        for number, leader in enumerate(leaders):
            if same_behaviour(answers[leader], answer, check):
                groups.append(number)
                break
        else:
            groups.append(len(leaders))
            leaders.append(len(groups) - 1)
    return groups
