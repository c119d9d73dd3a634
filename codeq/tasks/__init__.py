"""Executable DebugBench tasks: loaders, the LeetCode harness, hidden-test synthesis, the
train/test split by problem, and `score_programs`, the one place verdicts are decided."""

from codeq.tasks.harness import PRELUDE, RUNNER_SOURCE
from codeq.tasks.loaders import RawItem, deduplicate, load_source
from codeq.tasks.pipeline import prepare, split_by_slug
from codeq.tasks.scoring import outputs_match, score_programs

__all__ = [
    "PRELUDE",
    "RUNNER_SOURCE",
    "RawItem",
    "deduplicate",
    "load_source",
    "outputs_match",
    "prepare",
    "score_programs",
    "split_by_slug",
]
