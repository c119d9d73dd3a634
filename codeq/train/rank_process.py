"""One data-parallel training process: torchrun runs `python -m codeq.train.rank_process SPEC`
in each of the train.processes processes that `codeq.train.distributed.launch_ranks` starts. It
trains its rank of the run the spec names (codeq.train.dpo) and, on failure, records its error
for the launching process to re-raise."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from codeq.config import CodeQConfig
from codeq.errors import EXIT_INTERNAL, EXIT_OK, CodeQError
from codeq.schemas import Lineage
from codeq.train.checkpoints import CheckpointTarget
from codeq.train.distributed import record_rank_error, this_rank
from codeq.train.dpo import load_pairs, train_in_this_process

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """One training process of the run the spec file `argv[0]` describes."""
    from codeq.logs import setup_logging

    spec = json.loads(Path((argv if argv is not None else sys.argv[1:])[0]).read_text())
    setup_logging()
    if this_rank() != 0:  # rank 0 logs for all; the others only warn
        from datasets.utils.logging import disable_progress_bar

        logging.getLogger().setLevel(logging.WARNING)
        disable_progress_bar()
    out_dir = Path(spec["out_dir"])
    try:
        config = CodeQConfig.model_validate(spec["config"])
        checkpoints = spec.get("checkpoints")
        resume_from = spec.get("resume_from")
        reference = spec.get("reference")
        train_in_this_process(
            load_pairs(Path(spec["pairs"])),
            out_dir,
            config,
            CheckpointTarget.from_json(checkpoints) if checkpoints else None,
            Path(resume_from) if resume_from else None,
            Lineage.model_validate(reference) if reference else None,
        )
    except Exception as exc:
        record_rank_error(out_dir, exc)
        if isinstance(exc, CodeQError):
            log.error("rank %d: %s", this_rank(), exc)
            return exc.exit_code
        log.error("rank %d: unexpected error", this_rank(), exc_info=exc)
        return EXIT_INTERNAL
    _close_process_group()
    return EXIT_OK


def _close_process_group() -> None:
    """After a finished run only: a rank that failed exits at once, and torchrun stops the rest.
    The barrier keeps any rank from closing its connections while another still uses them (rank 0
    writes the metrics after the last collective)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    from codeq.logs import exit_at_once

    # Gloo's C++ worker threads can outlive the process group and abort a finished rank while
    # Python tears down ("terminate called without an active exception", exit -6 after a
    # complete run: CI saw it once); everything a rank writes is written and closed by now.
    exit_at_once(main())
