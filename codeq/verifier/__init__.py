"""The learned verifier (muCode's): P(a program passes all its task's tests) from (task,
program), a LoRA sequence classifier on the policy's base model trained on the programs a
round wrote; used as Q_ai in pairs, to break ties among final answers, and in search."""

from codeq.verifier.data import Program, label_unknown, nothing_to_learn, written_programs
from codeq.verifier.metrics import program_auc, rank_auc
from codeq.verifier.model import Verifier, VerifierInfo, VerifierTieBreak, read_info
from codeq.verifier.train import train_verifier

__all__ = [
    "Program",
    "Verifier",
    "VerifierInfo",
    "VerifierTieBreak",
    "label_unknown",
    "nothing_to_learn",
    "program_auc",
    "rank_auc",
    "read_info",
    "train_verifier",
    "written_programs",
]
