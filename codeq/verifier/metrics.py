"""How well scores rank programs: the rank AUC, and the verifier's AUC on the programs an
evaluation wrote (validation rewrites), each labelled by running it on all its task's tests."""

from __future__ import annotations

import random
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from codeq.schemas import Task, Trajectory


def rank_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """The chance that a positive scores above a negative (ties count half; 0.5: no signal);
    None without both a positive and a negative."""
    negatives = sorted(s for s, label in zip(scores, labels, strict=True) if not label)
    positives = [s for s, label in zip(scores, labels, strict=True) if label]
    if not positives or not negatives:
        return None
    wins = 0.0
    for score in positives:
        below = bisect_left(negatives, score)
        wins += below + 0.5 * (bisect_right(negatives, score) - below)
    return wins / (len(positives) * len(negatives))


def _by_task(
    groups: Sequence[Hashable], scores: Sequence[float], labels: Sequence[bool]
) -> dict[Hashable, list[tuple[float, bool]]]:
    by_group: dict[Hashable, list[tuple[float, bool]]] = defaultdict(list)
    for group, score, label in zip(groups, scores, labels, strict=True):
        by_group[group].append((score, bool(label)))
    return by_group


def within_task_auc(
    groups: Sequence[Hashable], scores: Sequence[float], labels: Sequence[bool]
) -> dict[str, Any]:
    """The chance that a passing program outscores a failing one *of the same task* (ties half),
    pooled over every such pair: what choosing among one task's candidates needs. The plain AUC
    also rewards telling easy tasks from hard ones, which no choice within a task uses."""
    wins = 0.0
    pairs = tasks = 0
    for members in _by_task(groups, scores, labels).values():
        task_scores, task_labels = [s for s, _ in members], [lab for _, lab in members]
        auc = rank_auc(task_scores, task_labels)
        if auc is None:
            continue
        passing = sum(task_labels)
        tasks += 1
        pairs += passing * (len(members) - passing)
        wins += auc * passing * (len(members) - passing)
    return {"auc": wins / pairs if pairs else None, "tasks": tasks, "pairs": pairs}


def percentile_interval(values: list[float], level: float) -> tuple[float, float]:
    """The central `level` interval of bootstrap draws."""
    values = sorted(values)
    tail = (1.0 - level) / 2
    high = min(len(values) - 1, int((1 - tail) * len(values)))
    return values[int(tail * len(values))], values[high]


def within_task_interval(
    groups: Sequence[Hashable],
    scores: Sequence[float],
    labels: Sequence[bool],
    *,
    level: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of `within_task_auc`, resampling the tasks that hold
    both a passing and a failing program (a task drawn twice counts twice); None without one."""
    mixed = [
        members
        for members in _by_task(groups, scores, labels).values()
        if len({label for _, label in members}) == 2
    ]
    if not mixed:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        drawn = rng.choices(mixed, k=len(mixed))
        keys = [index for index, members in enumerate(drawn) for _ in members]
        flat = [member for members in drawn for member in members]
        value = within_task_auc(keys, [s for s, _ in flat], [lab for _, lab in flat])["auc"]
        values.append(value)
    return percentile_interval(values, level)


def auc_interval(
    groups: Sequence[Hashable],
    scores: Sequence[float],
    labels: Sequence[bool],
    *,
    level: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of `rank_auc`, resampling whole tasks (a task's programs
    are not independent of each other); None without both labels."""
    by_group = _by_task(groups, scores, labels)
    keys = list(by_group)
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        members = [m for key in rng.choices(keys, k=len(keys)) for m in by_group[key]]
        value = rank_auc([s for s, _ in members], [lab for _, lab in members])
        if value is not None:
            values.append(value)
    if not values:
        return None
    return percentile_interval(values, level)


def evaluation_programs(
    tasks: Sequence[Task], trajectories: Iterable[Trajectory]
) -> tuple[list[tuple[Task, str]], dict[tuple[str, str], list[float]]]:
    """The distinct valid rewrites of `trajectories` on `tasks` (a trajectory of another task is
    skipped), and the self-critique scores each got where it was critiqued."""
    by_id = {task.task_id: task for task in tasks}
    items: dict[tuple[str, str], tuple[Task, str]] = {}
    critiques: dict[tuple[str, str], list[float]] = {}
    for trajectory in trajectories:
        task = by_id.get(trajectory.task_id)
        if task is None:
            continue
        for node in trajectory.nodes[1:]:
            if not node.valid:
                continue
            key = (task.task_id, node.program)
            items.setdefault(key, (task, node.program))
            if node.q_ai is not None:
                critiques.setdefault(key, []).append(node.q_ai)
    return list(items.values()), critiques


def program_auc(
    tasks: Sequence[Task], trajectories: Iterable[Trajectory], verifier: Any, sandbox: Any
) -> dict[str, Any]:
    """The verifier's AUC over the distinct valid rewrites of `trajectories`, each labelled by
    all its task's tests (run in `sandbox`); beside it the self-critique's AUC over those of
    them it scored (the mean of a program's critiques)."""
    from codeq.tasks import score_programs

    items, critiques = evaluation_programs(tasks, trajectories)
    if not items:
        return {"auc": None, "programs": 0, "passing": 0, "failing": 0}
    labels = [verdict.passed for verdict in score_programs(items, "all", sandbox)]
    scores = verifier.score(items)
    critiqued = [
        (sum(found) / len(found), label)
        for (task, program), label in zip(items, labels, strict=True)
        if (found := critiques.get((task.task_id, program)))
    ]
    task_ids = [task.task_id for task, _ in items]
    return {
        "auc": rank_auc(scores, labels),
        "within_task": within_task_auc(task_ids, scores, labels),
        "programs": len(items),
        "passing": sum(labels),
        "failing": len(labels) - sum(labels),
        "critique_auc": rank_auc([s for s, _ in critiqued], [lab for _, lab in critiqued])
        if critiqued
        else None,
        "critiqued_programs": len(critiqued),
    }
