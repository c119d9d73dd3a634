"""Data-parallel DPO in one pod: with train.processes = N > 1 the caller (the train job, `codeq
train`) launches N training processes with torchrun, one per GPU (on CPU they talk over gloo),
and waits for them. Each process loads the base model on its own device (LOCAL_RANK) and TRL's
DPOTrainer (through accelerate) wraps it in DistributedDataParallel; only rank 0 writes the
adapter and metrics.json. The caller stays the one process that reads and writes the store and
the stage's completion marker.

torchrun (torch.distributed.run) is what `accelerate launch --multi_gpu` runs underneath;
accelerate's own launcher has no multi-process CPU mode without MPI, so torchrun launches both.

The batch: one process trains on per_device_batch_size x gradient_accumulation_steps pairs per
optimizer step, and N processes train on as many (`batch_plan`). Each rank takes 1/N of them: its
micro-batch is the largest size up to per_device_batch_size that divides its share, and it
accumulates share / micro-batch of them. With the defaults (2 x 8): 8 GPUs run 2 x 1 each, 4 GPUs
2 x 2, 16 GPUs 1 x 1. DDP averages the ranks' gradients, so a step's gradient is the mean over the
same number of pairs as on one process. Trainer's length bucketing is widened to a whole step
(MeteredDPOTrainer) and accelerate deals micro-batches to the ranks round robin, so N processes
train each step on the pairs one process trains on; except at an epoch's end, where accelerate
fills the last round of micro-batches up to N full ones with pairs from the epoch's start
(`even_batches`: DDP ranks must run as many steps), fewer than N x the micro-batch of them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, TrainConfig
from codeq.errors import CodeQError, ConfigError, TrainingProcessError
from codeq.schemas import Lineage, write_json
from codeq.train.checkpoints import CheckpointTarget

log = logging.getLogger(__name__)

SPEC_FILE = "launch.json"  # what every rank trains: the pairs, its output folder, the config
ERRORS_DIR = "rank-errors"  # rank-<n>.json: the error a rank failed with, re-raised by the caller
METRICS_FILE = "metrics.json"
RANK_MODULE = "codeq.train.rank_process"  # what torchrun runs in each training process
STOP_GRACE_S = 60  # after SIGTERM, torchrun stops its workers (30 s) before it is killed


@dataclass(frozen=True)
class BatchPlan:
    """How each of `processes` ranks batches its share of an optimizer step's pairs."""

    processes: int
    per_device_batch_size: int
    gradient_accumulation_steps: int

    @property
    def pairs_per_step(self) -> int:
        return self.processes * self.per_device_batch_size * self.gradient_accumulation_steps


def batch_plan(config: TrainConfig) -> BatchPlan:
    """Per-rank micro-batch and accumulation that keep the single-process pairs per step."""
    processes = config.processes
    pairs_per_step = config.per_device_batch_size * config.gradient_accumulation_steps
    if pairs_per_step % processes:
        raise ConfigError(
            f"train.processes={processes} cannot share the {pairs_per_step} pairs of an optimizer "
            f"step (train.per_device_batch_size={config.per_device_batch_size} x "
            f"train.gradient_accumulation_steps={config.gradient_accumulation_steps}) evenly",
            hint="make per_device_batch_size x gradient_accumulation_steps a multiple of the "
            "process count (on the cluster, stages.train.gpus)",
        )
    share = pairs_per_step // processes
    micro = max(
        size for size in range(1, min(share, config.per_device_batch_size) + 1) if share % size == 0
    )
    return BatchPlan(processes, micro, share // micro)


def this_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def require_devices(processes: int) -> None:
    """On CUDA every process needs a GPU of its own (NCCL refuses two ranks on one device)."""
    import torch

    if torch.cuda.is_available() and processes > torch.cuda.device_count():
        raise ConfigError(
            f"train.processes={processes} but this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)",
            hint="train with one process per GPU: set train.processes (on the cluster, "
            "stages.train.gpus) to at most the GPU count",
        )


def launch_ranks(
    pairs_path: Path,
    out_dir: Path,
    config: CodeQConfig,
    checkpoints: CheckpointTarget | None = None,
    resume_from: Path | None = None,
    reference: Lineage | None = None,
) -> dict[str, Any]:
    """Run DPO in config.train.processes processes; return the metrics rank 0 wrote."""
    processes = config.train.processes
    require_devices(processes)
    plan = batch_plan(config.train)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out_dir / ERRORS_DIR, ignore_errors=True)
    (out_dir / METRICS_FILE).unlink(missing_ok=True)
    spec = out_dir / SPEC_FILE
    write_json(
        spec,
        {
            "pairs": str(pairs_path),
            "out_dir": str(out_dir),
            "config": config.model_dump(mode="json"),
            "checkpoints": checkpoints.to_json() if checkpoints is not None else None,
            "resume_from": str(resume_from) if resume_from is not None else None,
            "reference": reference.model_dump(mode="json") if reference is not None else None,
        },
    )
    log.info(
        "DPO in %d data-parallel processes, each %d pairs x %d accumulation steps (%d pairs a step)",
        processes,
        plan.per_device_batch_size,
        plan.gradient_accumulation_steps,
        plan.pairs_per_step,
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={processes}",
        "-m",
        RANK_MODULE,
        str(spec),
    ]
    returncode = _run(command)
    if returncode != 0:
        raise rank_error(out_dir / ERRORS_DIR, processes, returncode)
    metrics_path = out_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise TrainingProcessError(
            f"the {processes} training processes exited 0 but rank 0 wrote no {metrics_path}",
            hint="this is a bug in codeq; the job's log above has the processes' output",
        )
    metrics: dict[str, Any] = json.loads(metrics_path.read_text())
    return metrics


def _run(command: list[str]) -> int:
    """Run torchrun and wait; if this process is stopped (SIGTERM becomes StageTerminated, or
    Ctrl-C), stop torchrun, which stops its workers."""
    process = subprocess.Popen(command)
    try:
        return process.wait()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def record_rank_error(out_dir: Path, exc: BaseException) -> None:
    rank = this_rank()
    write_json(
        out_dir / ERRORS_DIR / f"rank-{rank}.json",
        {
            "rank": rank,
            "type": type(exc).__name__,
            "codeq": isinstance(exc, CodeQError),
            "message": str(exc),
            "hint": getattr(exc, "hint", None),
        },
    )


def _error_types() -> dict[str, type[CodeQError]]:
    found: dict[str, type[CodeQError]] = {}
    pending: list[type[CodeQError]] = [CodeQError]
    while pending:
        kind = pending.pop()
        found[kind.__name__] = kind
        pending.extend(kind.__subclasses__())
    return found


def rank_error(errors_dir: Path, processes: int, returncode: int) -> CodeQError:
    """The error to raise for failed ranks: the lowest rank's CodeQ error as itself (a diverged
    loss stays exit 3, bad pairs exit 2), else a TrainingProcessError naming what failed."""
    records = sorted(
        (json.loads(path.read_text()) for path in errors_dir.glob("rank-*.json")),
        key=lambda record: int(record["rank"]),
    )
    types = _error_types()
    for record in records:
        if record["codeq"] and record["type"] in types:
            return types[record["type"]](record["message"], hint=record["hint"])
    if records:
        first = records[0]
        return TrainingProcessError(
            f"training process {first['rank']} of {processes} failed: "
            f"{first['type']}: {first['message']}",
            hint="its traceback is in the job's log above",
        )
    return TrainingProcessError(
        f"the {processes} training processes stopped (torchrun exit {returncode}) without an "
        "error of their own: killed, out of memory, or a failed start",
        hint="the job's log above has torchrun's report of the process that stopped",
    )
