"""Resumable DPO: every train.checkpoint_every_s seconds the trainer writes a checkpoint (the
adapter, optimizer, scheduler and random states, the step reached; and ours: the best held-out
adapter so far, step times, padding counts) and rank 0 copies it to the store. A stopped train
(a preempted pod, a laptop closed) resumes from the last copy instead of from step 0.

In the store, under the round's `train-progress/` prefix:
    checkpoint-<step>/...   one complete checkpoint (its MANIFEST.json written last)
    LATEST.json             {"step", "fingerprint"}: written after the checkpoint it names is
                            complete, so a kill mid-upload leaves the previous one in use
Older checkpoints are deleted once LATEST names a newer one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codeq.config import StoreConfig
from codeq.progress import progress_bar
from codeq.store import ArtifactStore, join_key, open_store

LATEST_NAME = "LATEST.json"
STATE_NAME = "codeq_state_rank{rank}.json"  # each rank's own counters
BEST_ADAPTER_NAME = "codeq_best_adapter.safetensors"  # the same on every rank (DDP)


@dataclass(frozen=True)
class CheckpointTarget:
    """Where rank 0 keeps checkpoints: a prefix of the store `store` names, and the train
    stage's fingerprint, under which alone they may be resumed."""

    store: StoreConfig
    prefix: str
    fingerprint: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store.model_dump(mode="json"),
            "prefix": self.prefix,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointTarget:
        return cls(
            store=StoreConfig.model_validate(data["store"]),
            prefix=data["prefix"],
            fingerprint=data["fingerprint"],
        )

    def open(self) -> ArtifactStore:
        return open_store(self.store)


class CheckpointClock:
    """Says when a checkpoint is due: `every_s` seconds of training after the last one (or
    after the start); never when every_s is 0."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.every_s > 0 and time.monotonic() - self.last >= self.every_s

    def saved(self) -> None:
        self.last = time.monotonic()


def checkpoint_step(checkpoint_dir: Path) -> int:
    """The optimizer step a Trainer checkpoint was written at."""
    state = json.loads((Path(checkpoint_dir) / "trainer_state.json").read_text())
    return int(state["global_step"])


def steps_bar(state: Any, desc: str) -> Any:
    """A progress bar over a Trainer's optimizer steps (on the main process only), starting
    at the step a resumed run continues from."""
    bar = progress_bar(state.max_steps, desc, unit="step", enabled=state.is_world_process_zero)
    if state.global_step:
        bar.update(state.global_step)
    return bar


def latest(store: ArtifactStore, prefix: str) -> dict[str, Any] | None:
    """The LATEST.json record under `prefix`, or None when no checkpoint was completed."""
    key = join_key(prefix, LATEST_NAME)
    if not store.exists(key):
        return None
    record: dict[str, Any] = store.get_json(key)
    return record


def upload_checkpoint(target: CheckpointTarget, checkpoint_dir: Path, step: int) -> None:
    """Copy one local checkpoint to the store, point LATEST at it, then drop the older one."""
    store = target.open()
    previous = latest(store, target.prefix)
    store.put_dir(join_key(target.prefix, f"checkpoint-{step}"), checkpoint_dir)
    store.put_json(
        join_key(target.prefix, LATEST_NAME), {"step": step, "fingerprint": target.fingerprint}
    )
    if previous is not None and previous.get("step") != step:
        store.delete_prefix(join_key(target.prefix, f"checkpoint-{previous['step']}"))


def download_latest(store: ArtifactStore, prefix: str, into: Path) -> Path:
    """The checkpoint LATEST names, downloaded (every file checked against its manifest)."""
    record = latest(store, prefix)
    if record is None:
        raise FileNotFoundError(f"no checkpoint under {store.describe(prefix)}")
    name = f"checkpoint-{record['step']}"
    target = into / name
    store.get_dir(join_key(prefix, name), target)
    return target


def write_rank_state(checkpoint_dir: Path, rank: int, state: dict[str, Any]) -> None:
    (checkpoint_dir / STATE_NAME.format(rank=rank)).write_text(json.dumps(state, indent=2))


def read_rank_state(checkpoint_dir: Path, rank: int) -> dict[str, Any]:
    path = checkpoint_dir / STATE_NAME.format(rank=rank)
    state: dict[str, Any] = json.loads(path.read_text())
    return state
