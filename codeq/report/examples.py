"""Example fixes for the report: unified diffs of the buggy program against the program the
model returned, for test tasks it solved."""

from __future__ import annotations

import difflib
from typing import Any

from codeq.schemas import Trajectory

EXAMPLES = 3


def example_diffs(
    trajectories: list[Trajectory], per_task: dict[str, bool], count: int = EXAMPLES
) -> list[dict[str, Any]]:
    """Up to `count` solved tasks, in task-id order (deterministic), each with the diff from
    its buggy program (the tree's root) to the program the search returned (its final node)."""
    examples = []
    for trajectory in sorted(trajectories, key=lambda t: t.task_id):
        if not per_task.get(trajectory.task_id):
            continue
        buggy = trajectory.nodes[0].program
        returned = trajectory.nodes[trajectory.final_node].program
        if returned == buggy:
            continue
        diff = difflib.unified_diff(
            buggy.splitlines(),
            returned.splitlines(),
            fromfile=f"{trajectory.task_id} (buggy)",
            tofile=f"{trajectory.task_id} (returned)",
            lineterm="",
        )
        examples.append(
            {
                "task_id": trajectory.task_id,
                "level": trajectory.level,
                "category": trajectory.category,
                "diff": "\n".join(diff),
            }
        )
        if len(examples) == count:
            break
    return examples
