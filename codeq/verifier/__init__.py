"""The learned verifier (muCode's): P(a program passes all its task's tests) from (task,
program), a LoRA sequence classifier on the policy's base model trained on the programs a
round wrote; used as Q_ai in pairs, to break ties among final answers, and in search."""

from codeq.verifier.data import (
    Program,
    distinct_programs,
    label_unknown,
    nothing_to_learn,
    written_programs,
)
from codeq.verifier.metrics import (
    auc_interval,
    program_auc,
    rank_auc,
    within_task_auc,
    within_task_interval,
)
from codeq.verifier.model import Verifier, VerifierInfo, VerifierTieBreak, read_info
from codeq.verifier.train import train_verifier

__all__ = [
    "Program",
    "Verifier",
    "VerifierInfo",
    "VerifierTieBreak",
    "auc_interval",
    "distinct_programs",
    "label_unknown",
    "nothing_to_learn",
    "program_auc",
    "rank_auc",
    "read_info",
    "train_verifier",
    "within_task_auc",
    "within_task_interval",
    "written_programs",
]
