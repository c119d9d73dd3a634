"""`codeq round` and `codeq rounds`: every stage of a round in one process, with a local folder
(or any store) as the artifact store; rounds chain through the store's promoted policy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, dump_config
from codeq.config_layers import PRESETS_DIR
from codeq.logs import log
from codeq.pipeline.round_state import (
    next_round,
    require_previous_finished,
    rounds_without_promotion,
)
from codeq.pipeline.stages import STAGE_FUNCTIONS, STAGES, StageContext, round_stages
from codeq.store import join_key, open_store

LOCAL_ROUND_PRESET = PRESETS_DIR / "laptop.yaml"
# The effective settings of a finished local round, in its store folder: stage commands given
# a path inside the round use them (codeq/commands/common.py), `codeq config --run` shows them.
SETTINGS_NAME = "settings.yaml"


@dataclass
class RoundProgress:
    """Where `codeq round(s)` is: what an interrupt reports as finished. Updated in place."""

    rounds_done: list[int] = field(default_factory=list)  # rounds finished by this command
    round: int | None = None  # the round running now
    stage: str | None = None  # its stage running now
    stages_done: list[str] = field(default_factory=list)  # its stages complete (run or kept)
    stages: list[str] = field(default_factory=lambda: list(STAGES))  # the round's, in order

    def describe(self) -> str:
        """E.g. 'round 0 finished; round 1 stopped in train (stage 4/7) after prepare,
        collect, pairs finished'."""
        parts = []
        if self.rounds_done:
            plural = "s" if len(self.rounds_done) > 1 else ""
            parts.append(f"round{plural} {', '.join(map(str, self.rounds_done))} finished")
        if self.round is not None and self.stage is not None:
            index = self.stages.index(self.stage) + 1
            done = (
                f"after {', '.join(self.stages_done)} finished"
                if self.stages_done
                else "before any stage finished"
            )
            parts.append(
                f"round {self.round} stopped in {self.stage} (stage {index}/{len(self.stages)}) "
                f"{done}"
            )
        return "; ".join(parts) or "no stage had started"


def run_round(
    config: CodeQConfig,
    out_dir: Path,
    *,
    source: str | None = None,
    engines: dict[str, Any] | None = None,
    force: bool = False,
    progress: RoundProgress | None = None,
) -> dict[str, Any]:
    """Run prepare -> collect (-> verifier, when verifier.enabled) -> pairs -> train -> evaluate
    -> promote -> report of round `config.store.round` against `config.store` (stages already
    complete there are skipped); returns timings and paths. Refused while the previous round of
    the run has not finished.

    `engines` holds policies loaded by earlier rounds (lineage id -> engine; kept and extended
    here, so a promoted candidate is not loaded again as the next round's policy) and may name a
    stand-in policy for collect under "collect". `force` recomputes every stage, replacing
    outputs made earlier (codeq/pipeline/fingerprint.py). `progress` is kept up to date."""
    progress = progress if progress is not None else RoundProgress()
    store = open_store(config.store)
    context = StageContext(
        config=config,
        store=store,
        scratch=out_dir / "work" / config.store.run,  # runs never share scratch files
        engines=engines if engines is not None else {},
        force=force,
    )
    require_previous_finished(store, context.layout)
    timings: dict[str, float] = {}
    results: dict[str, Any] = {}
    started = time.perf_counter()
    progress.round, progress.stages_done = context.layout.round, []
    progress.stages = stages = round_stages(config)
    for index, stage in enumerate(stages, start=1):
        log(f"=== round {context.layout.round}, stage {index}/{len(stages)}: {stage} ===")
        progress.stage = stage
        stage_started = time.perf_counter()
        arguments: dict[str, Any] = {"source": source} if stage == "prepare" else {}
        results[stage] = STAGE_FUNCTIONS[stage](context, **arguments)
        timings[stage] = round(time.perf_counter() - stage_started, 1)
        progress.stages_done.append(stage)
        log(f"{stage} took {timings[stage]:.1f}s")
    store.put_bytes(
        join_key(context.layout.round_prefix, SETTINGS_NAME), settings_file(config).encode()
    )
    progress.rounds_done.append(context.layout.round)
    progress.round = progress.stage = None
    report_key = join_key(context.layout.stage("report"), "index.html")
    report_path = _local_path(store, report_key)
    return {
        "round": context.layout.round,
        "seconds": round(time.perf_counter() - started, 1),
        "timings": timings,
        "results": results,
        "promoted": bool(store.marker(context.layout.stage("promote")).get("promote")),
        "report": str(report_path) if report_path else store.describe(report_key),
    }


@dataclass
class RoundsOutcome:
    """What `run_rounds` did, and why it stopped."""

    summaries: list[dict[str, Any]]  # the rounds it ran, in order
    finished: int  # the run's finished rounds now (0..finished-1)
    without_promotion: int  # of those, the latest ones in a row that promoted nothing
    patience: int  # promotion.patience
    stopped_by_patience: bool  # it stopped before `rounds` because of promotion.patience


def run_rounds(
    config: CodeQConfig,
    out_dir: Path,
    rounds: int,
    *,
    source: str | None = None,
    progress: RoundProgress | None = None,
) -> RoundsOutcome:
    """Run the run's next rounds until it has `rounds` finished rounds, or until the last
    `promotion.patience` rounds in a row promoted nothing. Rerunning resumes where it stopped."""
    store = open_store(config.store)
    run = config.store.run
    engines: dict[str, Any] = {}
    summaries: list[dict[str, Any]] = []
    patience = config.promotion.patience
    stopped = False
    while (number := next_round(store, run)) < rounds:
        streak = rounds_without_promotion(store, run)
        if streak >= patience:
            log(
                f"run {run}: the last {streak} round(s) in a row promoted nothing "
                f"(promotion.patience = {patience}); stopping before round {number}"
            )
            stopped = True
            break
        summaries.append(
            run_round(
                config.as_round(number), out_dir, source=source, engines=engines, progress=progress
            )
        )
    return RoundsOutcome(
        summaries=summaries,
        finished=next_round(store, run),
        without_promotion=rounds_without_promotion(store, run),
        patience=patience,
        stopped_by_patience=stopped,
    )


def settings_file(config: CodeQConfig) -> str:
    """The round's effective settings as a config file (every key)."""
    return (
        f"# The settings round {config.store.round} of run {config.store.run} finished with "
        "(written by `codeq round`). A stage command\n# given a path inside this round uses "
        "them unless --preset or -c says otherwise.\n" + dump_config(config)
    )


def _local_path(store: Any, key: str) -> Path | None:
    root = getattr(store, "root", None)
    return Path(root) / key if root is not None else None
