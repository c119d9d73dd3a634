"""The stages of a round against an artifact store: shared by `python -m jobs.<stage>` and
`codeq round`.

Every stage follows one protocol: refuse to start unless its inputs' `_COMPLETE` markers exist,
skip all work when its own marker exists, download inputs (checked against their manifests),
compute in a local scratch folder, upload outputs with a manifest, and write its marker last.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.errors import BadInputError, CorruptInputError, MissingInputError, StoreError
from codeq.schemas import Trajectory, read_jsonl, write_json, write_jsonl
from codeq.store import MARKER_NAME, ArtifactStore, RoundLayout, join_key, log

STAGES = ["prepare", "collect", "pairs", "train", "evaluate", "promote", "report"]
CURRENT_INFO = "CURRENT.json"


@dataclass
class StageContext:
    """What every stage gets: the config, the store, and a local scratch folder."""

    config: CodeQConfig
    store: ArtifactStore
    scratch: Path
    engines: dict[str, Any] = field(default_factory=dict)  # shared policy engines (local round)

    @property
    def layout(self) -> RoundLayout:
        return RoundLayout(self.config.store.run, self.config.store.round)

    def workdir(self, name: str) -> Path:
        path = self.scratch / f"round-{self.config.store.round}" / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def _already_done(ctx: StageContext, prefix: str, stage: str) -> dict[str, Any] | None:
    if ctx.store.is_complete(prefix):
        log(f"{stage}: already complete at {ctx.store.describe(prefix)}; skipping")
        return {"skipped": True, **ctx.store.marker(prefix)}
    return None


def _finish(ctx: StageContext, prefix: str, stage: str, info: dict[str, Any]) -> dict[str, Any]:
    created = ctx.store.mark_complete(prefix, {"stage": stage, **info})
    if not created:
        log(f"{stage}: another worker completed {ctx.store.describe(prefix)} first")
    log(f"{stage}: done -> {ctx.store.describe(prefix)}")
    return {"skipped": False, **info}


# ------------------------------------------------------------------------------ prepare


def prepare_stage(ctx: StageContext, source: str | None = None) -> dict[str, Any]:
    from codeq.tasks import prepare

    prefix = ctx.layout.stage("tasks")
    done = _already_done(ctx, prefix, "prepare")
    if done:
        return done
    source = source or ctx.config.tasks.source
    out_dir = ctx.workdir("tasks")
    log(f"prepare: building tasks from {source}")
    report = prepare(source, out_dir, ctx.config)
    ctx.store.put_dir(prefix, out_dir)
    counts = {name: _count_lines(out_dir / f"{name}.jsonl") for name in ("train", "test")}
    return _finish(ctx, prefix, "prepare", {"source": source, "tasks": counts, "report": report})


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum(1 for line in path.open(encoding="utf-8") if line.strip())


def _download_stage(ctx: StageContext, stage: str, what: str, workdir: str) -> Path:
    """An earlier stage's output, refused unless its completion marker exists."""
    prefix = ctx.layout.stage(stage)
    ctx.store.require_complete(prefix, what)
    target = ctx.workdir(workdir)
    ctx.store.get_dir(prefix, target)
    return target


def _download_tasks(ctx: StageContext) -> Path:
    return _download_stage(ctx, "tasks", "tasks (prepare)", "tasks-in")


# ------------------------------------------------------------------------------ collect


def collect_stage(ctx: StageContext, shard_index: int = 0, shard_count: int = 1) -> dict[str, Any]:
    """Search one shard of the train tasks. Each finished trajectory is uploaded at once as
    `trajectories/shard-<i>/tasks/<task_id>.json`; a restarted pod downloads those first and
    skips their tasks, so a kill at any point loses at most the task in flight."""
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise BadInputError(
            f"shard index {shard_index} is outside 0..{shard_count - 1}",
            hint="JOB_COMPLETION_INDEX must be below JOB_COMPLETION_COUNT",
        )
    prefix = ctx.layout.shard(shard_index)
    done = _already_done(ctx, prefix, f"collect shard {shard_index}")
    if done:
        return done
    tasks_dir = _download_tasks(ctx)
    out_dir = ctx.workdir(f"shard-{shard_index}")
    out_path = out_dir / "trajectories.jsonl"
    restored = restore_shard_progress(ctx, shard_index, out_path)
    log(
        f"collect shard {shard_index}/{shard_count}: {restored} task(s) restored from the store; "
        "searching the rest"
    )
    from codeq.search import collect

    uploader = TrajectoryUploader(ctx.store, ctx.layout, shard_index, out_path)
    uploader.start()
    try:
        stats = collect(
            tasks_dir / "train.jsonl",
            out_path,
            ctx.config,
            shard_index=shard_index,
            shard_count=shard_count,
            engine=ctx.engines.get("collect", ctx.engines.get("base")),
        )
    finally:
        uploader.stop()
    uploader.sync()  # raises StoreError if something could still not be uploaded
    trajectories = unique_trajectories(read_jsonl(out_path, Trajectory))
    final_dir = ctx.workdir(f"shard-{shard_index}-out")
    write_jsonl(final_dir / "trajectories.jsonl", trajectories)
    write_json(final_dir / "stats.json", stats)
    ctx.store.put_dir(prefix, final_dir)
    info = {
        "shard_index": shard_index,
        "shard_count": shard_count,
        "trajectories": len(trajectories),
        "solved": sum(t.solved for t in trajectories),
    }
    return _finish(ctx, prefix, f"collect shard {shard_index}", info)


def unique_trajectories(trajectories: list[Trajectory]) -> list[Trajectory]:
    """One trajectory per task id (the last one wins), in first-seen order."""
    by_task: dict[str, Trajectory] = {}
    for trajectory in trajectories:
        by_task[trajectory.task_id] = trajectory
    return list(by_task.values())


def restore_shard_progress(ctx: StageContext, shard_index: int, out_path: Path) -> int:
    """Rebuild the local trajectories file from the per-task objects already in the store."""
    task_prefix = join_key(ctx.layout.shard(shard_index), "tasks")
    restored: list[Trajectory] = []
    for key in ctx.store.list(task_prefix):
        if not key.endswith(".json"):
            continue
        try:
            restored.append(Trajectory.model_validate_json(ctx.store.get_bytes(key)))
        except ValueError:
            log(f"collect: ignoring unreadable {ctx.store.describe(key)}; its task is redone")
    write_jsonl(out_path, unique_trajectories(restored))
    return len(restored)


class TrajectoryUploader:
    """Follows the append-only trajectories file and uploads each new complete line as its own
    object (idempotent overwrite), while collect keeps searching."""

    def __init__(
        self, store: ArtifactStore, layout: RoundLayout, shard_index: int, path: Path
    ) -> None:
        self.store = store
        self.layout = layout
        self.shard_index = shard_index
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.uploaded = 0
        self.last_error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trajectory-uploader", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sync()
            except StoreError as exc:  # retried on the next poll; sync() at the end re-raises
                self.last_error = exc

    def sync(self) -> None:
        with self._lock:
            if not self.path.exists():
                return
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
            for line in data.splitlines(keepends=True):
                if not line.endswith(b"\n"):
                    break  # a line still being written
                if line.strip():
                    self._upload(line)
                self.offset += len(line)

    def _upload(self, line: bytes) -> None:
        try:
            task_id = json.loads(line)["task_id"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptInputError(f"{self.path}: unreadable trajectory line ({exc})") from None
        key = self.layout.shard_task(self.shard_index, task_id)
        self.store.put_bytes(key, line.rstrip(b"\n") + b"\n")
        self.uploaded += 1


# ------------------------------------------------------------------------------ pairs


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


def pairs_stage(ctx: StageContext) -> dict[str, Any]:
    prefix = ctx.layout.stage("pairs")
    done = _already_done(ctx, prefix, "pairs")
    if done:
        return done
    shard_files: list[Path] = []
    for index in completed_shards(ctx):
        shard_dir = ctx.workdir(f"pairs-in/shard-{index}")
        ctx.store.get_dir(ctx.layout.shard(index), shard_dir)
        shard_files.append(shard_dir / "trajectories.jsonl")
    from codeq.pairs import make_pairs

    out_dir = ctx.workdir("pairs")
    log(f"pairs: building preference pairs from {len(shard_files)} shard(s)")
    stats = make_pairs(shard_files, out_dir, ctx.config)
    ctx.store.put_dir(prefix, out_dir)
    return _finish(
        ctx, prefix, "pairs", {"pairs": stats["pairs"], "trajectories": stats["trajectories"]}
    )


# ------------------------------------------------------------------------------ train


def train_stage(ctx: StageContext) -> dict[str, Any]:
    """Train the round's adapter. With zero pairs there is nothing to learn from: the marker
    records `trained: false` and later stages keep the current policy."""
    prefix = ctx.layout.stage("adapter")
    done = _already_done(ctx, prefix, "train")
    if done:
        return done
    pairs_dir = _download_stage(ctx, "pairs", "pairs", "train-in")
    n_pairs = _count_lines(pairs_dir / "pairs.jsonl")
    if n_pairs == 0:
        log("train: the pairs stage produced no pairs; no adapter is trained this round")
        empty = ctx.workdir("adapter-empty")
        write_json(empty / "metrics.json", {"trained": False, "reason": "no preference pairs"})
        ctx.store.put_dir(prefix, empty)
        return _finish(ctx, prefix, "train", {"trained": False, "reason": "no preference pairs"})
    from codeq.train import train_dpo

    out_dir = ctx.workdir("train")
    log(f"train: DPO with LoRA on {n_pairs} pairs")
    metrics = train_dpo(pairs_dir / "pairs.jsonl", out_dir, ctx.config)
    adapter_dir = out_dir / "adapter"
    write_json(adapter_dir / "metrics.json", metrics)
    log(f"train: uploading the adapter to {ctx.store.describe(prefix)}")
    ctx.store.put_dir(prefix, adapter_dir)
    summary = {
        "trained": True,
        "pairs": n_pairs,
        "global_steps": metrics.get("global_steps"),
        "train_loss": metrics.get("train_loss"),
    }
    return _finish(ctx, prefix, "train", summary)


def download_adapter(ctx: StageContext, prefix: str, name: str) -> Path | None:
    """The adapter folder at `prefix` (None when that round trained none)."""
    ctx.store.require_complete(prefix, f"the adapter ({ctx.store.describe(prefix)})")
    if not ctx.store.marker(prefix).get("trained", True):
        return None
    target = ctx.workdir(name)
    ctx.store.get_dir(prefix, target)
    _require_adapter_config(ctx, prefix, target, hint="rerun the train stage of that round")
    return target


def download_current(ctx: StageContext, name: str) -> Path:
    """The promoted adapter in runs/<run>/current (checked against its manifest)."""
    target = ctx.workdir(name)
    ctx.store.get_dir(ctx.layout.current, target)
    _require_adapter_config(
        ctx,
        ctx.layout.current,
        target,
        hint="promote a round again (`codeq promote` or the promote job)",
    )
    return target


def _require_adapter_config(ctx: StageContext, prefix: str, folder: Path, hint: str) -> None:
    if not (folder / "adapter_config.json").is_file():
        raise MissingInputError(
            f"{ctx.store.describe(prefix)} holds no adapter_config.json", hint=hint
        )


# ------------------------------------------------------------------------------ evaluate


def current_policy(ctx: StageContext) -> dict[str, Any] | None:
    """The promoted adapter's CURRENT.json, or None while the base model is the policy."""
    key = join_key(ctx.layout.current, CURRENT_INFO)
    if not ctx.store.exists(key):
        return None
    info = ctx.store.get_json(key)
    return info if isinstance(info, dict) else None


def _evaluate(
    ctx: StageContext, tasks_path: Path, out_dir: Path, adapter: Path | None
) -> dict[str, Any]:
    from codeq.evaluate import evaluate

    engine = ctx.engines.get("base") if adapter is None else None
    result: dict[str, Any] = evaluate(
        tasks_path, out_dir, ctx.config, adapter=str(adapter) if adapter else None, engine=engine
    )
    return result


def evaluate_stage(ctx: StageContext) -> dict[str, Any]:
    """Evaluate the round's adapter (eval/results.json) and the incumbent policy on the same
    test tasks (eval/baseline/results.json). The incumbent is the promoted adapter
    (runs/<run>/current) or, before any promotion, the base model. Its results are reused from
    the round that promoted it when that evaluation covered the same task ids and mode."""
    prefix = ctx.layout.stage("eval")
    done = _already_done(ctx, prefix, "evaluate")
    if done:
        return done
    tasks_dir = _download_tasks(ctx)
    adapter = download_adapter(ctx, ctx.layout.stage("adapter"), "eval-adapter")
    tasks_path = tasks_dir / "test.jsonl"
    out_dir = ctx.workdir("eval")
    candidate: dict[str, Any] | None = None
    if adapter is not None:
        log("evaluate: the new adapter on the test tasks")
        _evaluate(ctx, tasks_path, out_dir, adapter)
        candidate = _read_results(out_dir / "results.json")
    else:
        log("evaluate: no adapter was trained this round; evaluating the incumbent only")
    baseline_dir = out_dir / "baseline"
    incumbent = current_policy(ctx)
    reused = _reuse_incumbent_results(ctx, incumbent, candidate, baseline_dir)
    if not reused:
        incumbent_adapter = None
        if incumbent is not None:
            incumbent_adapter = download_current(ctx, "eval-incumbent")
        label = f"the promoted adapter of round {incumbent['round']}" if incumbent else "base"
        log(f"evaluate: the incumbent policy ({label}) on the same tasks")
        _evaluate(ctx, tasks_path, baseline_dir, incumbent_adapter)
    summary = {
        "candidate": _headline(out_dir / "results.json") if candidate is not None else None,
        "baseline": _headline(baseline_dir / "results.json"),
        "baseline_policy": (
            {"kind": "adapter", "round": incumbent["round"]} if incumbent else {"kind": "base"}
        ),
        "baseline_reused": reused,
    }
    write_json(out_dir / "summary.json", summary)
    ctx.store.put_dir(prefix, out_dir)
    return _finish(ctx, prefix, "evaluate", summary)


def _headline(results_path: Path) -> dict[str, Any]:
    results = json.loads(results_path.read_text())
    mode = results["primary_mode"]
    primary = results["modes"][mode]
    return {
        "primary_mode": mode,
        "solve_rate": primary.get("solve_rate"),
        "solved": sum(bool(v) for v in primary.get("per_task", {}).values()),
        "tasks": len(results.get("task_ids", [])),
    }


def _reuse_incumbent_results(
    ctx: StageContext,
    incumbent: dict[str, Any] | None,
    candidate: dict[str, Any] | None,
    baseline_dir: Path,
) -> bool:
    if incumbent is None or candidate is None:
        return False
    old_eval = RoundLayout(ctx.layout.run, int(incumbent["round"])).stage("eval")
    key = join_key(old_eval, "results.json")
    if not ctx.store.is_complete(old_eval) or not ctx.store.exists(key):
        return False
    old = ctx.store.get_json(key)
    if old.get("task_ids") != candidate.get("task_ids") or old.get("primary_mode") != candidate.get(
        "primary_mode"
    ):
        return False
    write_json(baseline_dir / "results.json", old)
    log(f"evaluate: reusing round {incumbent['round']}'s results for the incumbent")
    return True


# ------------------------------------------------------------------------------ promote


def promote_stage(ctx: StageContext) -> dict[str, Any]:
    """Copy the round's adapter to runs/<run>/current only if it solves more of the same test
    tasks (primary mode, per task) than the incumbent; write promote/decision.json either way."""
    prefix = ctx.layout.stage("promote")
    done = _already_done(ctx, prefix, "promote")
    if done:
        return done
    eval_dir = _download_stage(ctx, "eval", "evaluation", "promote-in")
    decision = decide_promotion(eval_dir)
    decision["round"] = ctx.layout.round
    if decision["promote"]:
        adapter_prefix = ctx.layout.stage("adapter")
        adapter_dir = download_adapter(ctx, adapter_prefix, "promote-adapter")
        assert adapter_dir is not None  # decide_promotion only promotes a trained adapter
        copy_to_current(ctx, adapter_dir)
        decision["current"] = ctx.store.describe(ctx.layout.current)
    log(
        f"promote: {'PROMOTED' if decision['promote'] else 'kept the incumbent'}: "
        f"{decision['reason']}"
    )
    out_dir = ctx.workdir("promote")
    write_json(out_dir / "decision.json", decision)
    ctx.store.put_dir(prefix, out_dir)
    return _finish(ctx, prefix, "promote", decision)


def decide_promotion(eval_dir: Path) -> dict[str, Any]:
    candidate_path = eval_dir / "results.json"
    baseline_path = eval_dir / "baseline" / "results.json"
    if not baseline_path.is_file():
        raise MissingInputError(f"{baseline_path} is missing", hint="rerun the evaluate stage")
    baseline = _read_results(baseline_path)
    if not candidate_path.is_file():
        return {
            "promote": False,
            "reason": "no adapter was trained this round (no preference pairs)",
        }
    candidate = _read_results(candidate_path)
    mode = candidate["primary_mode"]
    if mode not in baseline["modes"]:
        raise CorruptInputError(
            f"the baseline evaluation has no {mode!r} mode", hint="rerun the evaluate stage"
        )
    new_per_task = candidate["modes"][mode]["per_task"]
    old_per_task = baseline["modes"][mode]["per_task"]
    if set(new_per_task) != set(old_per_task):
        raise CorruptInputError(
            "the new and the incumbent evaluations cover different task ids",
            hint="rerun the evaluate stage so both use the same test tasks",
        )
    new_solved = sum(bool(v) for v in new_per_task.values())
    old_solved = sum(bool(v) for v in old_per_task.values())
    gained = sorted(t for t in new_per_task if new_per_task[t] and not old_per_task[t])
    lost = sorted(t for t in new_per_task if old_per_task[t] and not new_per_task[t])
    promote = new_solved > old_solved
    verb = "beats" if promote else ("ties" if new_solved == old_solved else "trails")
    reason = (
        f"new adapter {verb} the incumbent on {mode}: {new_solved}/{len(new_per_task)} vs "
        f"{old_solved}/{len(old_per_task)} test tasks solved"
        + ("" if promote else "; promotion needs strictly more")
    )
    return {
        "promote": promote,
        "reason": reason,
        "mode": mode,
        "tasks": len(new_per_task),
        "new_solved": new_solved,
        "incumbent_solved": old_solved,
        "gained": gained,
        "lost": lost,
    }


def _read_results(path: Path) -> dict[str, Any]:
    try:
        results = json.loads(path.read_text())
        mode = results["primary_mode"]
        results["modes"][mode]["per_task"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptInputError(
            f"{path} is not an evaluation result ({type(exc).__name__}: {exc})",
            hint="rerun the evaluate stage",
        ) from None
    return dict(results)


def copy_to_current(ctx: StageContext, adapter_dir: Path) -> None:
    """Upload the adapter under runs/<run>/current; CURRENT.json (written after the manifest)
    names the round, so a reader sees either the old or the new complete adapter's info."""
    current = ctx.layout.current
    ctx.store.put_dir(current, adapter_dir)
    ctx.store.put_json(
        join_key(current, CURRENT_INFO),
        {"round": ctx.layout.round, "source": ctx.store.describe(ctx.layout.stage("adapter"))},
    )


# ------------------------------------------------------------------------------ report


def report_stage(ctx: StageContext) -> dict[str, Any]:
    """Render report.json, report.md and index.html from the round's evaluation, training
    metrics, pair statistics and promotion decision."""
    prefix = ctx.layout.stage("report")
    done = _already_done(ctx, prefix, "report")
    if done:
        return done
    inputs = ctx.workdir("report-in")
    wanted = {
        "pairs": ["stats.json"],
        "adapter": ["metrics.json"],
        "eval": ["results.json", "baseline/results.json"],
        "promote": ["decision.json"],
    }
    found: dict[str, Path] = {}
    for stage, names in wanted.items():
        stage_prefix = ctx.layout.stage(stage)
        ctx.store.require_complete(stage_prefix, stage)
        for name in names:
            target = inputs / stage / name
            if ctx.store.get_verified_file(stage_prefix, name, target):
                found[f"{stage}/{name}"] = target
    from codeq.report import render_report

    out_dir = ctx.workdir("report")
    log("report: rendering report.json, report.md and index.html")
    index = render_report(
        out_dir,
        results=found.get("eval/results.json"),
        base_results=found.get("eval/baseline/results.json"),
        train_metrics=found.get("adapter/metrics.json"),
        pair_stats=found.get("pairs/stats.json"),
        title=f"CodeQ run {ctx.layout.run}, round {ctx.layout.round}",
    )
    decision = json.loads(found["promote/decision.json"].read_text())
    write_json(out_dir / "decision.json", decision)
    ctx.store.put_dir(prefix, out_dir)
    info = {
        "index": ctx.store.describe(join_key(prefix, index.name)),
        "promoted": decision["promote"],
    }
    return _finish(ctx, prefix, "report", info)


StageFunction = Callable[..., dict[str, Any]]
STAGE_FUNCTIONS: dict[str, StageFunction] = {
    "prepare": prepare_stage,
    "collect": collect_stage,
    "pairs": pairs_stage,
    "train": train_stage,
    "evaluate": evaluate_stage,
    "promote": promote_stage,
    "report": report_stage,
}
