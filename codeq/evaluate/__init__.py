"""Evaluation on held-out tasks (each returned program scored on all its tests), and its
statistics."""

from codeq.evaluate.results import EvalResults, ModeResult
from codeq.evaluate.run import ANY_NODE_LABEL, evaluate, rewrites_within_budget
from codeq.evaluate.stats import summarize, wilson_interval

__all__ = [
    "ANY_NODE_LABEL",
    "EvalResults",
    "ModeResult",
    "evaluate",
    "rewrites_within_budget",
    "summarize",
    "wilson_interval",
]
