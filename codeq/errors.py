"""One exception hierarchy for the library; the CLI turns these into one `error:` line.

Exit codes are part of the jobs contract (Kubernetes podFailurePolicy reads them):

- 0  success
- 1  unexpected internal error (a bug; Kubernetes may retry)
- 2  bad input or bad configuration: retrying cannot help, do not retry
- 3  the stage ran and failed for a deterministic reason (e.g. non-finite DPO loss)
- 75 transient failure (store unreachable, throttled): safe to retry (EX_TEMPFAIL)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_STAGE_FAILED = 3
EXIT_TRANSIENT = 75


class CodeQError(Exception):
    """Base class. `hint` tells the user how to fix it; `exit_code` follows the table above."""

    exit_code: int = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class BadInputError(CodeQError):
    """Input the user or an earlier stage supplied is missing, malformed or inconsistent."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(BadInputError):
    """A configuration key or value is invalid."""


class MissingInputError(BadInputError):
    """A stage's input (file, store object, completion marker, adapter) does not exist."""


class CorruptInputError(BadInputError):
    """A stage's input exists but cannot be parsed or fails its checksum."""


class DatasetError(BadInputError):
    """A task source (DebugBench clone, Hugging Face dataset) cannot be read."""


class ModelLoadError(BadInputError):
    """A model, tokenizer or adapter cannot be loaded from the given location."""


class RoundOrderError(BadInputError):
    """A round cannot start because an earlier round of the same run has not finished."""


class VerifierMissingError(MissingInputError):
    """A round asks for a learned verifier (pairs.q_ai or evaluate.tie_break) that it has not
    trained, and verifier.fallback does not allow the self-critique in its place."""


class VerifierLineageError(BadInputError):
    """A learned verifier was trained on another base model than the policy it would judge."""


class SandboxError(CodeQError):
    """The sandbox itself (not the program under test) failed: runsc missing, setup broken."""

    exit_code = EXIT_STAGE_FAILED


class StageFailedError(CodeQError):
    """A stage ran and failed deterministically; retrying the same input will fail again."""

    exit_code = EXIT_STAGE_FAILED


class TrainingDivergedError(StageFailedError):
    """DPO produced a non-finite loss or gradient."""


class TrainingProcessError(CodeQError):
    """A data-parallel training process died without a CodeQ error (a crash, out of memory, a
    collective that timed out); exit 1, so Kubernetes may retry it."""


class TransientError(CodeQError):
    """A failure that may pass on retry (network, throttling, preemption)."""

    exit_code = EXIT_TRANSIENT


class StoreError(TransientError):
    """The artifact store could not be reached after retries."""
