"""Solve-rate statistics: Wilson score intervals, broken down by level, category and subtype."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

from codeq.schemas import Task

BREAKDOWNS = {"by_level": "level", "by_category": "category", "by_subtype": "subtype"}


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n == 0."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 or n successes the bound is exactly 0 or 1; the subtraction leaves ~1e-17 (a rate
    # below its own lower bound, which matplotlib's error bars refuse).
    low = 0.0 if successes == 0 else max(0.0, centre - half_width)
    high = 1.0 if successes == n else min(1.0, centre + half_width)
    return low, high


def rate(solved: int, n: int, confidence: float) -> dict[str, Any]:
    low, high = wilson_interval(solved, n, confidence)
    return {
        "n": n,
        "solved": solved,
        "solve_rate": solved / n if n else 0.0,
        "ci_low": low,
        "ci_high": high,
    }


def summarize(
    tasks: Sequence[Task], solved: Mapping[str, bool], confidence: float = 0.95
) -> dict[str, Any]:
    """Overall solve rate with its Wilson interval, the same by level/category/subtype, and the
    per-task outcome (what promotion compares between rounds)."""
    summary = rate(sum(bool(solved[t.task_id]) for t in tasks), len(tasks), confidence)
    for key, attribute in BREAKDOWNS.items():
        groups: dict[str, list[bool]] = defaultdict(list)
        for task in tasks:
            groups[getattr(task, attribute)].append(bool(solved[task.task_id]))
        summary[key] = {
            name: rate(sum(outcomes), len(outcomes), confidence)
            for name, outcomes in sorted(groups.items())
        }
    summary["per_task"] = {task.task_id: bool(solved[task.task_id]) for task in tasks}
    return summary
