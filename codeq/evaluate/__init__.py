"""Evaluation on held-out tasks with hidden tests, and its statistics."""

from codeq.evaluate.run import ANY_NODE_LABEL, evaluate, final_node_within_budget
from codeq.evaluate.stats import summarize, wilson_interval

__all__ = [
    "ANY_NODE_LABEL",
    "evaluate",
    "final_node_within_budget",
    "summarize",
    "wilson_interval",
]
