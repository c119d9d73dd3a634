"""`codeq round` and `codeq rounds`: every stage of a round in one process, with a local folder
(or any store) as the artifact store; rounds chain through the store's promoted policy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.config_layers import PRESETS_DIR
from codeq.logs import log
from codeq.pipeline.round_state import finished_rounds, next_round, require_previous_finished
from codeq.pipeline.stages import STAGE_FUNCTIONS, STAGES, StageContext
from codeq.store import RoundLayout, join_key, open_store

LOCAL_ROUND_PRESET = PRESETS_DIR / "laptop.yaml"


def run_round(
    config: CodeQConfig,
    out_dir: Path,
    *,
    source: str | None = None,
    engines: dict[str, Any] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Run prepare -> collect -> pairs -> train -> evaluate -> promote -> report of round
    `config.store.round` against `config.store` (stages already complete there are skipped);
    returns timings and paths. Refused while the previous round of the run has not finished.

    `engines` holds policies loaded by earlier rounds (lineage id -> engine; kept and extended
    here, so a promoted candidate is not loaded again as the next round's policy) and may name a
    stand-in policy for collect under "collect". `force` recomputes every stage, replacing
    outputs made earlier (codeq/pipeline/fingerprint.py)."""
    store = open_store(config.store)
    context = StageContext(
        config=config,
        store=store,
        scratch=out_dir / "work",
        engines=engines if engines is not None else {},
        force=force,
    )
    require_previous_finished(store, context.layout)
    timings: dict[str, float] = {}
    results: dict[str, Any] = {}
    started = time.perf_counter()
    for index, stage in enumerate(STAGES, start=1):
        log(f"=== round {context.layout.round}, stage {index}/{len(STAGES)}: {stage} ===")
        stage_started = time.perf_counter()
        arguments: dict[str, Any] = {"source": source} if stage == "prepare" else {}
        results[stage] = STAGE_FUNCTIONS[stage](context, **arguments)
        timings[stage] = round(time.perf_counter() - stage_started, 1)
        log(f"{stage} took {timings[stage]:.1f}s")
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


def run_rounds(
    config: CodeQConfig, out_dir: Path, rounds: int, *, source: str | None = None
) -> list[dict[str, Any]]:
    """Run the run's next rounds until it has `rounds` finished rounds, or until the last
    `promotion.patience` rounds in a row promoted nothing. Rerunning resumes where it stopped."""
    store = open_store(config.store)
    run = config.store.run
    engines: dict[str, Any] = {}
    summaries: list[dict[str, Any]] = []
    while (number := next_round(store, run)) < rounds:
        if _rounds_without_promotion(store, run) >= config.promotion.patience:
            log(
                f"run {run}: the last {config.promotion.patience} round(s) promoted nothing; "
                "stopping (promotion.patience)"
            )
            break
        round_config = config.model_copy(
            update={"store": config.store.model_copy(update={"round": number})}
        )
        summaries.append(run_round(round_config, out_dir, source=source, engines=engines))
    return summaries


def _rounds_without_promotion(store: Any, run: str) -> int:
    """How many of the run's latest finished rounds in a row promoted nothing."""
    streak = 0
    for number in reversed(finished_rounds(store, run)):
        if store.marker(RoundLayout(run, number).stage("promote")).get("promote"):
            break
        streak += 1
    return streak


def _local_path(store: Any, key: str) -> Path | None:
    root = getattr(store, "root", None)
    return Path(root) / key if root is not None else None
