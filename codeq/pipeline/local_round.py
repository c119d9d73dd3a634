"""`codeq round`: every stage of one round in one process, with a local folder as the store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.config_layers import PRESETS_DIR
from codeq.pipeline.stages import STAGE_FUNCTIONS, STAGES, StageContext
from codeq.store import join_key, log, open_store

LOCAL_ROUND_PRESET = PRESETS_DIR / "laptop.yaml"


def run_round(
    config: CodeQConfig,
    out_dir: Path,
    *,
    source: str | None = None,
    engines: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run prepare -> collect -> pairs -> train -> evaluate -> promote -> report against
    `config.store` (stages already complete there are skipped); returns timings and paths.

    `engines` may hold ready policies: "base" (collect and the baseline evaluation) and
    "collect" (collect only, e.g. a stronger or scripted policy); missing ones are loaded."""
    store = open_store(config.store)
    context = StageContext(
        config=config, store=store, scratch=out_dir / "work", engines=dict(engines or {})
    )
    timings: dict[str, float] = {}
    results: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        for index, stage in enumerate(STAGES, start=1):
            log(f"=== stage {index}/{len(STAGES)}: {stage} ===")
            if stage in {"collect", "evaluate"}:
                _ensure_base_engine(context)
            stage_started = time.perf_counter()
            arguments: dict[str, Any] = {"source": source} if stage == "prepare" else {}
            results[stage] = STAGE_FUNCTIONS[stage](context, **arguments)
            timings[stage] = round(time.perf_counter() - stage_started, 1)
            log(f"{stage} took {timings[stage]:.1f}s")
    finally:
        context.engines.clear()
    report_key = join_key(context.layout.stage("report"), "index.html")
    report_path = _local_path(store, report_key)
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "timings": timings,
        "results": results,
        "report": str(report_path) if report_path else store.describe(report_key),
    }


def _ensure_base_engine(context: StageContext) -> None:
    """Load the base policy once and share it between collect and the baseline evaluation."""
    if "base" in context.engines or context.store.is_complete(context.layout.stage("eval")):
        return
    from codeq.policy import PolicyEngine

    log(f"loading the policy model {context.config.policy.model}")
    base_policy = context.config.policy.model_copy(update={"adapter": None})
    context.engines["base"] = PolicyEngine.load(base_policy, seed=context.config.tasks.seed)


def _local_path(store: Any, key: str) -> Path | None:
    root = getattr(store, "root", None)
    return Path(root) / key if root is not None else None
