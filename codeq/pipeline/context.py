"""What every stage module of a round builds on, below them all (docs/architecture.md): the
stage context, the stage protocol (`begin` skips or refuses an output, `finish` writes its
marker) and the inputs more than one stage reads (the round's tasks, its collect shards).
policies.py, stages.py and verifier.py import it; it imports none of them."""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.errors import CorruptInputError, MissingInputError
from codeq.pipeline.fingerprint import (
    Fingerprint,
    StaleOutputError,
    check_recorded,
    stage_fingerprint,
)
from codeq.schemas import Lineage
from codeq.store import MANIFEST_NAME, MARKER_NAME, ArtifactStore, RoundLayout, join_key, log


@dataclass
class StageContext:
    """What every stage gets: the config, the store, and a local scratch folder."""

    config: CodeQConfig
    store: ArtifactStore
    scratch: Path
    engines: dict[str, Any] = field(default_factory=dict)  # lineage id -> loaded engine, shared
    # by the stages of a local round ("collect" may name a stand-in policy for collect in tests)
    lineages: dict[str, Lineage] = field(default_factory=dict)  # the base's, fingerprinted once
    force: bool = False  # replace outputs made under another fingerprint instead of refusing

    @property
    def layout(self) -> RoundLayout:
        return RoundLayout(self.config.store.run, self.config.store.round)

    def workdir(self, name: str) -> Path:
        path = self.scratch / f"round-{self.config.store.round}" / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass
class StageRun:
    """One stage's run: where its output goes, what it depends on, and when it started."""

    stage: str
    prefix: str
    fingerprint: Fingerprint
    skipped: dict[str, Any] | None = None  # the marker of an output that is kept
    replacing: bool = False  # forced: the old output was unmarked and is being replaced
    started: float = field(default_factory=time.perf_counter)


def manifest_checksum(ctx: StageContext, prefix: str) -> str | None:
    """sha256 of a complete stage output's MANIFEST.json (None while it is not complete)."""
    if not ctx.store.is_complete(prefix):
        return None
    return hashlib.sha256(ctx.store.get_bytes(join_key(prefix, MANIFEST_NAME))).hexdigest()


def begin(
    ctx: StageContext,
    prefix: str,
    stage: str,
    inputs: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
    config_of: str | None = None,
) -> StageRun:
    """Skip a complete output with the same fingerprint; refuse one with another (or, forced,
    unmark it first and clear its old files so no reader takes a half-replaced output as
    complete). `inputs` names the input stages' prefixes; `config_of` the STAGE_KEYS entry."""
    checksums = {name: manifest_checksum(ctx, key) for name, key in (inputs or {}).items()}
    fingerprint = stage_fingerprint(ctx.config, config_of or stage, checksums, overrides)
    run = StageRun(stage=stage, prefix=prefix, fingerprint=fingerprint)
    if not ctx.store.is_complete(prefix):
        return run
    marker = ctx.store.marker(prefix)
    if ctx.force:
        log(f"{stage}: forced; replacing the output at {ctx.store.describe(prefix)}")
        ctx.store.unmark_complete(prefix)
        ctx.store.delete_prefix(prefix)
        run.replacing = True
        return run
    check_recorded(
        marker.get("fingerprint"), fingerprint, f"{stage}'s output at {ctx.store.describe(prefix)}"
    )
    log(f"{stage}: already complete at {ctx.store.describe(prefix)}; skipping")
    run.skipped = {"skipped": True, **marker}
    return run


def finish(ctx: StageContext, run: StageRun, info: dict[str, Any]) -> dict[str, Any]:
    seconds = round(time.perf_counter() - run.started, 1)
    body = {
        "stage": run.stage,
        **info,
        "seconds": seconds,
        "fingerprint": run.fingerprint.to_json(),
    }
    created = ctx.store.mark_complete(run.prefix, body)
    if not created:
        log(f"{run.stage}: another worker completed {ctx.store.describe(run.prefix)} first")
    log(f"{run.stage}: done in {seconds:.1f}s -> {ctx.store.describe(run.prefix)}")
    return {"skipped": False, **info, "seconds": seconds}


def download_stage(ctx: StageContext, stage: str, what: str, workdir: str) -> Path:
    """An earlier stage's output, refused unless its completion marker exists."""
    prefix = ctx.layout.stage(stage)
    ctx.store.require_complete(prefix, what)
    target = ctx.workdir(workdir)
    ctx.store.get_dir(prefix, target)
    return target


def download_tasks(ctx: StageContext) -> Path:
    return download_stage(ctx, "tasks", "tasks (prepare)", "tasks-in")


def completed_shards(ctx: StageContext) -> list[int]:
    """Shard indexes the pairs stage needs; every one must be complete."""
    trajectories_prefix = join_key(ctx.layout.round_prefix, "trajectories")
    markers = [
        key
        for key in ctx.store.list(trajectories_prefix)
        if key.endswith(f"/{MARKER_NAME}") and key.count("/") == trajectories_prefix.count("/") + 2
    ]
    if not markers:
        raise MissingInputError(
            f"no completed collect shard under {ctx.store.describe(trajectories_prefix)}",
            hint="run the collect stage (every shard) first",
        )
    counts = {int(ctx.store.get_json(key).get("shard_count", 0)) for key in markers}
    if len(counts) != 1 or 0 in counts:
        raise CorruptInputError(
            f"collect shards disagree on the shard count ({sorted(counts)})",
            hint="rerun collect for this round with one JOB_COMPLETION_COUNT",
        )
    shard_count = counts.pop()
    missing = [i for i in range(shard_count) if not ctx.store.is_complete(ctx.layout.shard(i))]
    if missing:
        raise MissingInputError(
            f"collect shard(s) {missing} of {shard_count} are not complete",
            hint="wait for every collect index to finish (or rerun the failed ones)",
        )
    return list(range(shard_count))


def recorded_shards(ctx: StageContext, prefix: str) -> list[int]:
    """The shards a complete pairs output was built from (its fingerprint's inputs), so a kept
    output is compared with the same shards' manifests (none for a marker from before
    fingerprints, which is kept as it always was)."""
    recorded = (ctx.store.marker(prefix).get("fingerprint") or {}).get("inputs") or {}
    return sorted(
        int(name.rsplit(" ", 1)[1]) for name in recorded if name.startswith("collect shard ")
    )


def empty_folder(folder: Path) -> None:
    """`folder`, made again empty."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def keep_progress(ctx: StageContext, run: StageRun, recorded: Any, prefix: str, what: str) -> bool:
    """A stopped stage's saved progress (`what`, under `prefix`) is kept only under the
    fingerprint it was made under; under another it is refused, or, forced, discarded."""
    try:
        check_recorded(recorded, run.fingerprint, what)
    except StaleOutputError:
        if not ctx.force:
            raise
        log(f"{run.stage}: forced; discarding {what}, made under another config")
        ctx.store.delete_prefix(prefix)
        return False
    return True


def restore_checkpoint(ctx: StageContext, run: StageRun, prefix: str) -> Path | None:
    """The last training checkpoint a stopped stage (train, verifier) kept under `prefix`,
    downloaded, if it was made under this stage's fingerprint; one of another config is
    refused, or, forced, discarded."""
    from codeq.train.checkpoints import download_latest, latest

    record = latest(ctx.store, prefix)
    what = f"the {run.stage} checkpoint at {ctx.store.describe(prefix)}"
    if record is None or not keep_progress(ctx, run, record.get("fingerprint"), prefix, what):
        return None
    resume_dir = ctx.workdir(f"{run.stage}-resume")
    empty_folder(resume_dir)
    checkpoint = download_latest(ctx.store, prefix, resume_dir)
    log(
        f"{run.stage}: resuming from the checkpoint of step {record['step']} at "
        f"{ctx.store.describe(prefix)}"
    )
    return checkpoint
