"""What the verifier learns from and reads: the programs a round wrote, each labelled by whether
it passes all of its task's tests, and the tokens of one (task, program)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codeq.errors import CorruptInputError
from codeq.policy.prompts import fenced, problem_text
from codeq.schemas import Task, Trajectory

QUESTION = "\n\nDoes this program pass every test of the problem?"


@dataclass(frozen=True)
class Program:
    """One distinct program written for a task; `passed` is whether it passes all the task's
    tests (None until it is known: a search rewarded by the visible tests only)."""

    task: Task
    program: str
    passed: bool | None


def written_programs(
    trajectories: Iterable[Trajectory], tasks: Mapping[str, Task], max_per_task: int
) -> list[Program]:
    """Every distinct valid rewrite of every trajectory (the first `max_per_task` of a task, in
    the order they were written), labelled from its verdict where that verdict covers all the
    task's tests. Invalid rewrites (empty, unchanged) and the buggy root are no programs the
    policy wrote."""
    programs: list[Program] = []
    for trajectory in trajectories:
        task = tasks.get(trajectory.task_id)
        if task is None:
            raise CorruptInputError(
                f"trajectory of task {trajectory.task_id} ({trajectory.slug}) has no task in "
                "the round's tasks",
                hint="use the tasks and trajectories of one round",
            )
        seen: set[str] = set()
        for node in trajectory.nodes[1:]:
            text = node.program.strip()
            if not node.valid or text in seen or len(seen) >= max_per_task:
                continue
            seen.add(text)
            known = trajectory.reward_tests == "all" and node.verdict is not None
            programs.append(Program(task, node.program, node.verdict.passed if known else None))  # type: ignore[union-attr]
    return programs


def distinct_programs(programs: Iterable[Program]) -> list[Program]:
    """`programs` without repeats: a program written again for the same problem (in a later
    round, by another policy) is learned from once, where it was first written."""
    seen: set[tuple[str, str]] = set()
    distinct: list[Program] = []
    for item in programs:
        key = (item.task.slug, item.program.strip())
        if key not in seen:
            seen.add(key)
            distinct.append(item)
    return distinct


def label_unknown(programs: Sequence[Program], sandbox: Any) -> list[Program]:
    """`programs` with every unknown label found by running the program on all its task's tests
    (codeq.tasks.score_programs in `sandbox`)."""
    from codeq.tasks import score_programs

    unknown = [index for index, item in enumerate(programs) if item.passed is None]
    if not unknown:
        return list(programs)
    verdicts = score_programs(
        [(programs[i].task, programs[i].program) for i in unknown], "all", sandbox
    )
    labelled = list(programs)
    for index, verdict in zip(unknown, verdicts, strict=True):
        labelled[index] = Program(programs[index].task, programs[index].program, verdict.passed)
    return labelled


def hold_out_tasks(
    programs: Sequence[Program], fraction: float, seed: int
) -> tuple[list[Program], list[Program]]:
    """(train, held out): about `fraction` of the problems (slugs) held out whole, so the
    held-out AUC measures problems the verifier never saw. Nothing is held out when fewer than
    two problems, or a held-out set would lack a passing or a failing program."""
    by_slug: dict[str, list[Program]] = defaultdict(list)
    for item in programs:
        by_slug[item.task.slug].append(item)
    slugs = sorted(by_slug)
    if fraction <= 0 or len(slugs) < 2:
        return list(programs), []
    random.Random(seed).shuffle(slugs)
    count = min(len(slugs) - 1, max(1, round(fraction * len(slugs))))
    held = [item for slug in slugs[:count] for item in by_slug[slug]]
    train = [item for slug in slugs[count:] for item in by_slug[slug]]
    if len({item.passed for item in held}) < 2 or len({item.passed for item in train}) < 2:
        return list(programs), []
    return train, held


def within_task_pairs(
    programs: Sequence[Program], per_task: int, seed: int
) -> list[tuple[Program, Program]]:
    """(passing, failing) programs of the same task: every such pair of a task, or `per_task`
    of them drawn with `seed` where it has more; tasks in the order first seen."""
    by_task: dict[str, list[Program]] = defaultdict(list)
    for item in programs:
        by_task[item.task.task_id].append(item)
    rng = random.Random(seed)
    pairs: list[tuple[Program, Program]] = []
    for members in by_task.values():
        task_pairs = [
            (good, bad) for good in members if good.passed for bad in members if bad.passed is False
        ]
        if len(task_pairs) > per_task:
            task_pairs = rng.sample(task_pairs, per_task)
        pairs.extend(task_pairs)
    return pairs


def nothing_to_learn(programs: Sequence[Program], pairwise: bool = False) -> str | None:
    """Why a verifier cannot be trained on `programs` (None when it can); `pairwise` needs a
    task with both a passing and a failing program."""
    if pairwise and programs and not within_task_pairs(programs, 1, 0):
        return (
            f"no task has both a passing and a failing program ({len(programs)} programs), "
            "which pairwise training learns from"
        )
    if not programs:
        return "the round wrote no valid program"
    passing = sum(bool(item.passed) for item in programs)
    if passing == 0:
        return f"none of the {len(programs)} programs passes all its tests"
    if passing == len(programs):
        return f"all {len(programs)} programs pass all their tests"
    return None


def encode(tokenizer: Any, task: Task, program: str, max_length: int) -> list[int]:
    """The token ids the verifier reads: the problem (statement, examples, constraints), then
    the program and the question. The program is kept whole where it fits (else its end); the
    problem is cut at its end to fill what is left of `max_length`."""
    head = tokenizer(f"{problem_text(task)}\n\nProgram:\n", add_special_tokens=True)["input_ids"]
    tail = tokenizer(fenced(program) + QUESTION, add_special_tokens=False)["input_ids"]
    tail = tail[-(max_length - min(len(head), 32)) :]
    return list(head[: max_length - len(tail)]) + list(tail)
