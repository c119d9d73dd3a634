"""The stages of a round against an artifact store: shared by `python -m jobs.<stage>` and
`codeq round`.

Every stage follows one protocol: refuse to start unless its inputs' `_COMPLETE` markers exist,
skip all work when its own marker exists and records the same fingerprint (the config keys the
stage reads and its inputs' manifests, codeq/pipeline/fingerprint.py; another one is refused
unless forced), download inputs (checked against their manifests), compute in a local scratch
folder, upload outputs with a manifest, and write its marker last, with the fingerprint and the
stage's wall time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codeq.config import CodeQConfig
from codeq.errors import CorruptInputError, MissingInputError
from codeq.evaluate.results import EvalResults, Rate, Split
from codeq.pipeline.context import (
    StageContext,
    StageRun,
    completed_shards,
    empty_folder,
    keep_progress,
    restore_checkpoint,
)
from codeq.pipeline.context import begin as _begin
from codeq.pipeline.context import download_stage as _download_stage
from codeq.pipeline.context import download_tasks as _download_tasks
from codeq.pipeline.context import finish as _finish
from codeq.pipeline.context import recorded_shards as _recorded_shards
from codeq.pipeline.fingerprint import (
    Fingerprint,
    stage_fingerprint,
)
from codeq.pipeline.policies import (
    current_pointer_round,
    current_policy,
    load_policy,
    policy_config,
    set_current,
)
from codeq.pipeline.round_state import require_previous_finished
from codeq.policy.source import require_adapter_dir
from codeq.schemas import Lineage, Task, Trajectory, read_jsonl, write_json, write_jsonl
from codeq.shards import check_job_shard
from codeq.store import MARKER_NAME, join_key, log

if TYPE_CHECKING:  # the evaluation (search, sandbox) is imported where a stage runs it
    from codeq.evaluate.run import SearchedTree

STAGES = ["prepare", "collect", "pairs", "train", "evaluate", "promote", "report"]


# ------------------------------------------------------------------------------ prepare


def prepare_stage(ctx: StageContext, source: str | None = None) -> dict[str, Any]:
    from codeq.tasks import prepare
    from codeq.tasks.pipeline import SPLITS

    prefix = ctx.layout.stage("tasks")
    source = source or ctx.config.tasks.source
    run = _begin(ctx, prefix, "prepare", overrides={"tasks.source": source})
    if run.skipped:
        return run.skipped
    require_previous_finished(ctx.store, ctx.layout)
    out_dir = ctx.workdir("tasks")
    log(f"prepare: building tasks from {source}")
    report = prepare(source, out_dir, ctx.config)
    _sample_train_tasks(ctx, out_dir / "train.jsonl", report)
    ctx.store.put_dir(prefix, out_dir)
    counts = {name: _count_lines(out_dir / f"{name}.jsonl") for name in SPLITS}
    return _finish(ctx, run, {"source": source, "tasks": counts, "report": report})


def _sample_train_tasks(ctx: StageContext, train_path: Path, report: dict[str, Any]) -> None:
    """Keep this round's sample of the train tasks (tasks.train_per_round), if one is set."""
    from codeq.tasks.pipeline import round_sample

    size = ctx.config.tasks.train_per_round
    if size is None:
        return
    tasks = read_jsonl(train_path, Task)
    sample = round_sample(tasks, size, ctx.config.tasks.seed, ctx.layout.round)
    write_jsonl(train_path, sample)
    report["train_this_round"] = len(sample)
    write_json(train_path.with_name("report.json"), report)
    log(f"prepare: round {ctx.layout.round} collects on {len(sample)} of {len(tasks)} train tasks")


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum(1 for line in path.open(encoding="utf-8") if line.strip())


# ------------------------------------------------------------------------------ collect


def collect_stage(ctx: StageContext, shard_index: int = 0, shard_count: int = 1) -> dict[str, Any]:
    """Search one shard of the train tasks. The search hands each finished trajectory to the
    stage, which uploads it at once as `trajectories/shard-<i>/tasks/<task_id>.json`; a
    restarted pod downloads those first and skips their tasks, so a kill at any point loses at
    most the tasks in flight."""
    check_job_shard(shard_index, shard_count)
    prefix = ctx.layout.shard(shard_index)
    run = _begin(
        ctx,
        prefix,
        f"collect shard {shard_index}",
        inputs=_policy_inputs(ctx, tasks=ctx.layout.stage("tasks")),
        overrides={"shard_count": shard_count},
        config_of="collect",
    )
    if run.skipped:
        return run.skipped
    tasks_dir = _download_tasks(ctx)
    out_dir = ctx.workdir(f"shard-{shard_index}")
    out_path = out_dir / "trajectories.jsonl"
    _check_shard_progress(ctx, run)
    restored = restore_shard_progress(ctx, shard_index, out_path)
    log(
        f"collect shard {shard_index}/{shard_count}: {restored} task(s) restored from the store; "
        "searching the rest"
    )
    from codeq.search import collect

    policy = current_policy(ctx)
    log(f"collect shard {shard_index}: searching with {policy.describe()}")
    engine = ctx.engines.get("collect") or load_policy(ctx, policy)

    def upload(trajectory: Trajectory) -> None:
        """Each finished trajectory becomes its own object at once (an idempotent overwrite)."""
        key = ctx.layout.shard_task(shard_index, trajectory.task_id)
        ctx.store.put_bytes(key, (trajectory.model_dump_json() + "\n").encode())

    stats = collect(
        tasks_dir / "train.jsonl",
        out_path,
        ctx.config,
        shard_index=shard_index,
        shard_count=shard_count,
        engine=engine,
        lineage=policy,
        on_trajectory=upload,
    )
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
        "policy": policy.id,
    }
    return _finish(ctx, run, info)


PROGRESS_NAME = "PROGRESS.json"


def _policy_inputs(ctx: StageContext, **inputs: str) -> dict[str, str]:
    """`inputs` plus the previous round's promotion decision: it decides the policy this round
    starts from (policy.model, a fingerprinted key, names the base)."""
    if ctx.layout.round > 0:
        previous = ctx.layout.of_round(ctx.layout.round - 1).stage("promote")
        inputs = {**inputs, f"promote (round {ctx.layout.round - 1})": previous}
    return inputs


def _check_shard_progress(ctx: StageContext, run: StageRun) -> None:
    """The per-task trajectories a shard saved so far (see `_check_saved_trees`)."""
    task_prefix = join_key(run.prefix, "tasks")
    _check_saved_trees(ctx, run, task_prefix, join_key(run.prefix, PROGRESS_NAME))


def _check_saved_trees(ctx: StageContext, run: StageRun, saved_prefix: str, record: str) -> None:
    """Trees a stopped stage saved under `saved_prefix` are kept only under the fingerprint they
    were searched under (recorded at `record`); under another one they are refused, or,
    forced, discarded. Then `record` holds this run's fingerprint."""
    saved = [key for key in ctx.store.list(saved_prefix) if key != record]
    if saved and ctx.store.exists(record):
        keep_progress(
            ctx,
            run,
            ctx.store.get_json(record).get("fingerprint"),
            saved_prefix,
            f"the {len(saved)} trees saved at {ctx.store.describe(saved_prefix)}",
        )
    ctx.store.put_json(record, {"fingerprint": run.fingerprint.to_json()})


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


# ------------------------------------------------------------------------------ pairs


def pairs_stage(ctx: StageContext) -> dict[str, Any]:
    prefix = ctx.layout.stage("pairs")
    keeping = ctx.store.is_complete(prefix) and not ctx.force
    shards = _recorded_shards(ctx, prefix) if keeping else completed_shards(ctx)
    inputs = {f"collect shard {index}": ctx.layout.shard(index) for index in shards}
    if ctx.config.pairs.q_ai == "verifier":  # the round's verifier gives Q_ai
        inputs.update(tasks=ctx.layout.stage("tasks"), verifier=ctx.layout.stage("verifier"))
    run = _begin(ctx, prefix, "pairs", inputs=inputs)
    if run.skipped:
        return run.skipped
    q_ai = None
    if ctx.config.pairs.q_ai == "verifier":
        from codeq.pipeline.verifier import pairs_q_ai

        q_ai = pairs_q_ai(ctx)
    shard_files: list[Path] = []
    for index in shards:
        shard_dir = ctx.workdir(f"pairs-in/shard-{index}")
        ctx.store.get_dir(ctx.layout.shard(index), shard_dir)
        shard_files.append(shard_dir / "trajectories.jsonl")
    from codeq.pairs import make_pairs

    out_dir = ctx.workdir("pairs")
    log(f"pairs: building preference pairs from {len(shard_files)} shard(s)")
    stats = make_pairs(shard_files, out_dir, ctx.config, q_ai=q_ai)
    ctx.store.put_dir(prefix, out_dir)
    return _finish(ctx, run, {"pairs": stats["pairs"], "trajectories": stats["trajectories"]})


# ------------------------------------------------------------------------------ train


def train_stage(ctx: StageContext) -> dict[str, Any]:
    """Train the round's adapter on the policy that wrote the pairs (a fresh LoRA on the merged
    promoted policy, which is thus DPO's reference). With zero pairs there is nothing to learn
    from: the marker records `trained: false` and later stages keep the current policy."""
    prefix = ctx.layout.stage("adapter")
    replayed = replayed_rounds(ctx)
    inputs = {"pairs": ctx.layout.stage("pairs")}
    inputs |= {
        f"round {number} pairs": ctx.layout.of_round(number).stage("pairs") for number in replayed
    }
    run = _begin(ctx, prefix, "train", inputs=inputs)
    if run.skipped:
        return run.skipped
    pairs_dir = _download_stage(ctx, "pairs", "pairs", "train-in")
    own_pairs = _count_lines(pairs_dir / "pairs.jsonl")
    pairs_path, replayed_counts = _replay_pairs(ctx, pairs_dir, replayed)
    n_pairs = own_pairs + sum(replayed_counts.values())
    if n_pairs == 0:
        log("train: the pairs stage produced no pairs; no adapter is trained this round")
        empty = ctx.workdir("adapter-empty")
        write_json(empty / "metrics.json", {"trained": False, "reason": "no preference pairs"})
        ctx.store.put_dir(prefix, empty)
        return _finish(ctx, run, {"trained": False, "reason": "no preference pairs"})
    from codeq.train import train_dpo
    from codeq.train.checkpoints import CheckpointTarget

    trained_on = _pairs_policy(ctx, pairs_dir)
    out_dir = ctx.workdir("train")
    progress_prefix = ctx.layout.stage(TRAIN_PROGRESS)
    resume_from = restore_checkpoint(ctx, run, progress_prefix)
    checkpoints = CheckpointTarget(ctx.config.store, progress_prefix, run.fingerprint.to_json())
    log(f"train: DPO with LoRA on {n_pairs} pairs, on (and against) {trained_on.describe()}")
    metrics = train_dpo(
        pairs_path,
        out_dir,
        policy_config(ctx, trained_on),
        checkpoints=checkpoints,
        resume_from=resume_from,
        reference=trained_on if replayed_counts else None,
    )
    adapter_dir = out_dir / "adapter"
    if replayed_counts:  # which of the pairs it trained on came from earlier rounds
        metrics["replayed"] = replayed_counts
    write_json(adapter_dir / "metrics.json", metrics)
    log(f"train: uploading the adapter to {ctx.store.describe(prefix)}")
    ctx.store.put_dir(prefix, adapter_dir)
    summary = {
        "trained": True,
        "pairs": n_pairs,
        **({"replayed": replayed_counts, "own_pairs": own_pairs} if replayed_counts else {}),
        "trained_on": trained_on.id,
        "global_steps": metrics.get("global_steps"),
        "resumed_from_step": metrics.get("resumed_from_step"),
        "train_loss": metrics.get("train_loss"),
    }
    finished = _finish(ctx, run, summary)
    ctx.store.delete_prefix(progress_prefix)  # the adapter is complete: its checkpoints are spent
    return finished


TRAIN_PROGRESS = "train-progress"


def replayed_rounds(ctx: StageContext) -> list[int]:
    """The earlier rounds whose pairs this round's DPO trains on too (train.earlier_rounds):
    each of that many rounds before this one whose pairs stage finished (one that did not is
    left out, with a line saying so)."""
    first = max(0, ctx.layout.round - ctx.config.train.earlier_rounds)
    replayed = []
    for number in range(first, ctx.layout.round):
        prefix = ctx.layout.of_round(number).stage("pairs")
        if ctx.store.is_complete(prefix):
            replayed.append(number)
        else:
            log(
                f"train: round {number}'s pairs are not replayed: {ctx.store.describe(prefix)} "
                "is not complete"
            )
    return replayed


def _replay_pairs(
    ctx: StageContext, pairs_dir: Path, replayed: list[int]
) -> tuple[Path, dict[str, int]]:
    """The pairs DPO trains on: this round's (pairs_dir/pairs.jsonl) alone, or with the
    replayed rounds' after them in one file, and how many each of those gave ("round N")."""
    if not replayed:
        return pairs_dir / "pairs.jsonl", {}
    lines = _jsonl_lines(pairs_dir / "pairs.jsonl")
    counts: dict[str, int] = {}
    for number in replayed:
        earlier = ctx.workdir(f"train-in-round-{number}")
        ctx.store.get_dir(ctx.layout.of_round(number).stage("pairs"), earlier)
        replayed_lines = _jsonl_lines(earlier / "pairs.jsonl")
        counts[f"round {number}"] = len(replayed_lines)
        lines += replayed_lines
    path = ctx.workdir("train-pairs") / "pairs.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    log(f"train: replaying {sum(counts.values())} pairs of earlier rounds ({counts})")
    return path, counts


def _jsonl_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _pairs_policy(ctx: StageContext, pairs_dir: Path) -> Lineage:
    """The policy that wrote the round's pairs (recorded by the pairs stage)."""
    stats = json.loads((pairs_dir / "stats.json").read_text())
    recorded = stats.get("policy")
    if recorded is None:
        raise CorruptInputError(
            f"{ctx.store.describe(ctx.layout.stage('pairs'))} records no policy",
            hint="rerun collect and pairs for this round",
        )
    return Lineage.model_validate(recorded)


def download_adapter(ctx: StageContext, name: str) -> Path | None:
    """This round's adapter folder (None when the round trained none)."""
    prefix = ctx.layout.stage("adapter")
    ctx.store.require_complete(prefix, f"the adapter ({ctx.store.describe(prefix)})")
    if not ctx.store.marker(prefix).get("trained", True):
        return None
    target = ctx.workdir(name)
    ctx.store.get_dir(prefix, target)
    return require_adapter_dir(
        target, shown=ctx.store.describe(prefix), hint="rerun the train stage of this round"
    )


def candidate_policy(ctx: StageContext, adapter_dir: Path) -> Lineage:
    """The policy this round's adapter makes: the policy it was trained on, with it merged.
    Refused unless it was trained on the run's current policy (the incumbent)."""
    from codeq.train.dpo import read_provenance
    from codeq.train.lineage import link_of

    trained_on = read_provenance(adapter_dir)
    incumbent = current_policy(ctx)
    if trained_on != incumbent:
        raise CorruptInputError(
            f"round {ctx.layout.round}'s adapter was trained on "
            f"{trained_on.describe() if trained_on else 'an unknown policy'}, but the run's "
            f"current policy is {incumbent.describe()}",
            hint="rerun this round from collect (or start a new run)",
        )
    link = link_of(adapter_dir, ctx.layout.round, ctx.layout.stage("adapter"))
    return incumbent.extended(link)


# ------------------------------------------------------------------------------ evaluate

EVAL_ROLES = ("candidate", "incumbent")
EVAL_SPLITS: tuple[Split, ...] = ("validation", "test")
EVAL_SHARDS = "eval-shards"  # runs/<run>/round-<n>/eval-shards/shard-<i>/: a sharded evaluation


def evaluate_stage(ctx: StageContext, shard_index: int = 0, shard_count: int = 1) -> dict[str, Any]:
    """Evaluate the round's candidate (the incumbent with the new adapter merged) and the
    incumbent (the run's current policy, scored again every round; the trees an earlier round
    searched for it are reused) on the same tasks: the validation split in promotion.modes and
    promotion.guard_modes, with promotion.samples sampled answers per task in the first mode
    (promotion decides there), and the test split in evaluate.modes (reported only). Writes
    eval/<role>/<split>/results.json.

    With shard_count > 1 (the evaluate Indexed Job), shard i evaluates whole search groups of
    each split (codeq.shards.shard_of_groups) into eval-shards/shard-<i>/, and the shard that
    finds every shard complete merges them into eval/ (merge_eval_shards): what one process
    writes, wall times aside."""
    check_job_shard(shard_index, shard_count)
    prefix = ctx.layout.stage("eval")
    inputs = _eval_inputs(ctx)
    run = _begin(ctx, prefix, "evaluate", inputs=inputs)
    if run.skipped:
        return run.skipped
    if shard_count > 1:
        return _evaluate_shard(ctx, run, inputs, shard_index, shard_count)
    out_dir = ctx.workdir("eval")
    progress = ctx.layout.stage(EVAL_PROGRESS)
    _begin_eval_progress(ctx, run, run.replacing, out_dir, progress)
    policies, summary = _evaluate_policies(ctx, out_dir, progress)
    summary.update(_record_verifier(ctx, _download_tasks(ctx), out_dir))
    write_json(out_dir / "summary.json", summary)
    ctx.store.put_dir(prefix, out_dir)
    finished = _finish(ctx, run, {"policies": list(policies), **summary})
    ctx.store.delete_prefix(progress)  # the evaluation is complete: its saved trees are spent
    return finished


EVAL_PROGRESS = "eval-progress"  # the trees a stopped evaluation finished, one object each


def _begin_eval_progress(
    ctx: StageContext, run: StageRun, replacing: bool, out_dir: Path, progress: str
) -> None:
    """`replacing` (forced), the evaluation being replaced is not resumed, here or from the
    store; otherwise the trees saved under `progress` are kept only under this run's
    fingerprint."""
    if replacing:
        empty_folder(out_dir)
        ctx.store.delete_prefix(progress)
    _check_saved_trees(ctx, run, progress, join_key(progress, PROGRESS_NAME))


def _saved_trees(ctx: StageContext, prefix: str) -> Callable[[SearchedTree], None]:
    """Each tree the evaluation finishes, saved at once as its own object under
    `prefix/<label>/trees/<task_id>.json` with its resume state beside (`STATE.json`), so a pod
    that starts on another node resumes without searching those tasks again."""

    def save(searched: SearchedTree) -> None:
        folder = join_key(prefix, searched.label)
        tree = searched.trajectory
        ctx.store.put_bytes(
            join_key(folder, "trees", f"{tree.task_id}.json"), tree.model_dump_json().encode()
        )
        ctx.store.put_json(join_key(folder, "STATE.json"), searched.state)

    return save


def restore_saved_trees(ctx: StageContext, prefix: str, out_dir: Path) -> int:
    """The trees `_saved_trees` kept under `prefix`, put back into out_dir's resume state
    (codeq.evaluate.run.merge_resume); returns how many tasks that adds."""
    from codeq.evaluate.run import merge_resume

    keys_of: dict[str, list[str]] = {}  # label -> its keys, from one listing
    for key in ctx.store.list(prefix):
        keys_of.setdefault(key.removeprefix(prefix + "/").split("/")[0], []).append(key)
    added = 0
    for label, keys in sorted(keys_of.items()):
        state_key = join_key(prefix, label, "STATE.json")
        if state_key not in keys:
            continue
        trees: list[Trajectory] = []
        for key in keys:
            if key == state_key:
                continue
            try:
                trees.append(Trajectory.model_validate_json(ctx.store.get_bytes(key)))
            except ValueError:
                log(f"evaluate: ignoring unreadable {ctx.store.describe(key)}; its task is redone")
        added += merge_resume(out_dir, label, ctx.store.get_json(state_key), trees)
    return added


def _record_verifier(ctx: StageContext, tasks_dir: Path, out_dir: Path) -> dict[str, Any]:
    """eval/verifier.json (the scorer that chose tied answers, the verifier's validation AUC)
    and its line in the summary; nothing for a round that uses no verifier."""
    from codeq.pipeline.verifier import describe, record_evaluation

    return describe(record_evaluation(ctx, tasks_dir, out_dir))


def _eval_inputs(ctx: StageContext) -> dict[str, str]:
    from codeq.pipeline.verifier import uses_verifier

    inputs = {"tasks": ctx.layout.stage("tasks"), "adapter": ctx.layout.stage("adapter")}
    if uses_verifier(ctx.config):  # it breaks ties among answers, its AUC is recorded
        inputs["verifier"] = ctx.layout.stage("verifier")
    return _policy_inputs(ctx, **inputs)


def _evaluate_policies(
    ctx: StageContext, out_dir: Path, progress: str, shard: tuple[int, int] | None = None
) -> tuple[dict[str, Lineage], dict[str, Any]]:
    """Each policy on each of its splits, into out_dir/<role>/<split>/; with `shard`, only the
    shard's part of each split (a split it gets no task of is left out). Every finished tree is
    saved under `progress`/<role>/<split>/ as well, and restored from there first. Returns the
    policies and the summary (per role and split: the primary mode's counts; per role: its
    lineage)."""
    from codeq.evaluate.run import load_eval_tasks

    tasks_dir = _download_tasks(ctx)
    adapter = download_adapter(ctx, "eval-adapter")
    policies = {"incumbent": current_policy(ctx)}
    if adapter is not None:
        policies = {"candidate": candidate_policy(ctx, adapter), **policies}
    else:
        log("evaluate: no adapter was trained this round; evaluating the incumbent only")
    has_validation = _count_lines(tasks_dir / "validation.jsonl") > 0
    summary: dict[str, Any] = {}
    for role, policy in policies.items():
        splits: list[Split] = ["test"]
        if adapter is not None and has_validation:
            splits = ["validation", "test"]
        for split in splits:
            config, _ = _split_config(ctx.config, split)
            if shard is not None and not load_eval_tasks(
                tasks_dir, split, config.evaluate.max_tasks, shard, config.search.parallel_trees
            ):
                log(f"evaluate shard {shard[0]}: none of the {split} tasks' groups is this shard's")
                continue
            log(f"evaluate: the {role} ({policy.describe()}) on the {split} tasks")
            folder, saved = out_dir / role / split, join_key(progress, role, split)
            _carry_over_searches(ctx, policy, split, folder)
            restored = restore_saved_trees(ctx, saved, folder)
            if restored:
                log(f"evaluate: {restored} tree(s) restored from {ctx.store.describe(saved)}")
            results = _evaluate(
                ctx, policy, tasks_dir, split, folder, shard, on_tree=_saved_trees(ctx, saved)
            )
            summary[f"{role}/{split}"] = _summary_of(results)
        summary[role] = policy.model_dump(mode="json")
    return policies, summary


def _summary_of(results: EvalResults) -> dict[str, Any]:
    return {
        "mode": results.primary_mode,
        "solved": results.primary().solved,
        "tasks": results.primary().n,
    }


def eval_shard_prefix(ctx: StageContext, index: int) -> str:
    return join_key(ctx.layout.stage(EVAL_SHARDS), f"shard-{index}")


def _eval_shard_overrides(ctx: StageContext, count: int) -> dict[str, Any]:
    """What a shard's output depends on beyond the evaluation's own fingerprint: which tasks
    are its own (the shard count and the group size)."""
    return {"shard_count": count, "shard_group": ctx.config.search.parallel_trees}


def _evaluate_shard(
    ctx: StageContext, merged: StageRun, inputs: dict[str, str], index: int, count: int
) -> dict[str, Any]:
    """Shard `index` of a sharded evaluation (kept when complete under the same fingerprint),
    then the merge when every shard is complete. Each shard writes its marker before it looks
    at the others', so the last one to finish sees them all (two that finish together may both
    merge: the merge is deterministic and the marker create-only)."""
    prefix = eval_shard_prefix(ctx, index)
    run = _begin(
        ctx,
        prefix,
        f"evaluate shard {index}",
        inputs=inputs,
        overrides=_eval_shard_overrides(ctx, count),
        config_of="evaluate",
    )
    if not run.skipped:
        out_dir = ctx.workdir(f"eval-shard-{index}")
        progress = join_key(ctx.layout.stage(EVAL_PROGRESS), f"shard-{index}")
        _begin_eval_progress(ctx, run, run.replacing or merged.replacing, out_dir, progress)
        policies, summary = _evaluate_policies(ctx, out_dir, progress, (index, count))
        ctx.store.put_dir(prefix, out_dir)
        info = {"shard_index": index, "shard_count": count, "policies": list(policies)}
        _finish(ctx, run, {**info, **summary})
        ctx.store.delete_prefix(progress)  # the shard is complete: its saved trees are spent
    waiting = unfinished_eval_shards(ctx, count, run.fingerprint)
    if waiting:
        log(
            f"evaluate shard {index}: shard(s) {waiting} of {count} not complete yet; the last "
            f"one to finish merges them into {ctx.store.describe(merged.prefix)}"
        )
        return {"skipped": run.skipped is not None, "shard_index": index, "merged": False}
    return merge_eval_shards(ctx, count, merged)


def unfinished_eval_shards(ctx: StageContext, count: int, fingerprint: Fingerprint) -> list[int]:
    """The shards of a `count`-shard evaluation without a marker of `fingerprint`."""
    waiting = []
    for index in range(count):
        prefix = eval_shard_prefix(ctx, index)
        recorded = (
            ctx.store.marker(prefix).get("fingerprint") if ctx.store.is_complete(prefix) else None
        )
        if not isinstance(recorded, dict) or recorded.get("sha256") != fingerprint.sha256:
            waiting.append(index)
    return waiting


def merge_eval_shards(ctx: StageContext, count: int, run: StageRun | None = None) -> dict[str, Any]:
    """Merge the `count` shards of the round's evaluation into eval/ (codeq.evaluate.shards);
    `run` is the evaluation's own (begun by the calling shard). Refused while a shard is not
    complete under the same config and inputs."""
    from codeq.evaluate.run import load_eval_tasks
    from codeq.evaluate.shards import merge_shard_folders

    if run is None:
        run = _begin(ctx, ctx.layout.stage("eval"), "evaluate", inputs=_eval_inputs(ctx))
        if run.skipped:
            return run.skipped

    shard_fingerprint = stage_fingerprint(
        ctx.config, "evaluate", run.fingerprint.inputs, _eval_shard_overrides(ctx, count)
    )
    waiting = unfinished_eval_shards(ctx, count, shard_fingerprint)
    if waiting:
        raise MissingInputError(
            f"cannot merge the evaluation: shard(s) {waiting} of {count} under "
            f"{ctx.store.describe(ctx.layout.stage(EVAL_SHARDS))} are not complete (no marker, "
            "or one made with another config or other inputs)",
            hint=f"run every index of the evaluate Job (JOB_COMPLETION_INDEX 0..{count - 1}, "
            f"JOB_COMPLETION_COUNT={count}) to the end; the last one to finish merges",
        )
    if ctx.store.is_complete(run.prefix):
        log(f"evaluate: another shard merged {ctx.store.describe(run.prefix)} first")
        return {"skipped": True, **ctx.store.marker(run.prefix)}
    log(f"evaluate: merging {count} shards into {ctx.store.describe(run.prefix)}")
    tasks_dir = _download_tasks(ctx)
    markers, folders = [], []
    for index in range(count):
        prefix = eval_shard_prefix(ctx, index)
        markers.append(ctx.store.marker(prefix))
        folder = ctx.workdir(f"eval-merge/shard-{index}")
        empty_folder(folder)
        ctx.store.get_dir(prefix, folder)
        folders.append(folder)
    out_dir = ctx.workdir("eval-merge/eval")
    empty_folder(out_dir)
    policies: list[str] = markers[0]["policies"]
    summary: dict[str, Any] = {}
    for role in policies:
        for split in EVAL_SPLITS:
            parts = [f / role / split for f in folders if (f / role / split).is_dir()]
            if not parts:
                continue
            config, _ = _split_config(ctx.config, split)
            tasks = load_eval_tasks(tasks_dir, split, config.evaluate.max_tasks)
            results = merge_shard_folders(parts, out_dir / role / split, tasks)
            summary[f"{role}/{split}"] = _summary_of(results)
        summary[role] = markers[0][role]
    summary.update(_record_verifier(ctx, tasks_dir, out_dir))
    write_json(out_dir / "summary.json", summary)
    ctx.store.put_dir(run.prefix, out_dir)
    # the stage's wall time: its slowest shard's, then this merge
    slowest = max(float(marker.get("seconds") or 0.0) for marker in markers)
    run.started = min(run.started, time.perf_counter() - slowest)
    return _finish(ctx, run, {"policies": policies, **summary, "shards": count})


def _carry_over_searches(ctx: StageContext, policy: Lineage, split: Split, out_dir: Path) -> None:
    """The trees an earlier round of the run searched for the same policy on the same split,
    copied in as this evaluation's resume state: the incumbent is the policy an earlier round
    evaluated (last round's promoted candidate, or the incumbent it kept), and searching it
    again would repeat the same seeded generation. Each mode's resume key (policy, model and
    search settings) still decides what is used, so a changed setting searches afresh; tasks the
    earlier trees lack are searched; each tree is answered again by this round's tie-break (a
    verifier learned this round chooses among the earlier round's rewrites) except where that
    tie-break steered the search (multi-turn best-of-N), and every answer is scored again."""
    from codeq.evaluate.run import is_resume_file

    if out_dir.is_dir() and any(is_resume_file(path.name) for path in out_dir.iterdir()):
        return  # this evaluation's own progress (after a preemption) comes first
    for number in range(ctx.layout.round - 1, -1, -1):
        prefix = ctx.layout.of_round(number).stage("eval")
        if not ctx.store.is_complete(prefix):
            continue
        files = ctx.store.read_manifest(prefix)["files"]
        for role in EVAL_ROLES:
            folder = f"{role}/{split}"
            if f"{folder}/results.json" not in files:
                continue
            earlier = ctx.workdir(f"eval-earlier/round-{number}/{folder}")
            ctx.store.get_verified_file(prefix, f"{folder}/results.json", earlier / "results.json")
            if EvalResults.load(earlier).policy != policy:
                continue
            copy_resume_state(ctx.store, prefix, files, folder, out_dir)
            log(
                f"evaluate: round {number} searched this policy on the {split} tasks as its "
                f"{role}; its trees are reused where the search settings match, answered by this "
                "round's tie-break and scored again"
            )
            return


def copy_resume_state(
    store: Any, prefix: str, files: Iterable[str], folder: str, out_dir: Path
) -> int:
    """The resume files (searched trees and their keys) directly in `folder` of the complete
    stage at `prefix` (`files`: its manifest's), copied into out_dir; returns how many."""
    from codeq.evaluate.run import is_resume_file

    copied = 0
    for relative in files:
        name = relative.removeprefix(f"{folder}/")
        if name != relative and "/" not in name and is_resume_file(name):
            store.get_verified_file(prefix, relative, out_dir / name)
            copied += 1
    return copied


def _split_config(config: CodeQConfig, split: Split) -> tuple[CodeQConfig, dict[str, int]]:
    """The config a split is evaluated with, and its sampled answers per mode: validation runs
    promotion's modes and guard modes on promotion.max_tasks tasks, with promotion.samples
    sampled answers in the first mode; test runs evaluate.modes."""
    if split != "validation":
        return config, {}
    promotion = config.promotion
    modes = list(dict.fromkeys([*promotion.modes, *promotion.guard_modes]))
    config = config.model_copy(
        update={
            "evaluate": config.evaluate.model_copy(
                update={"modes": modes, "max_tasks": promotion.max_tasks}
            )
        }
    )
    return config, {promotion.modes[0]: promotion.samples}


def _evaluate(
    ctx: StageContext,
    policy: Lineage,
    tasks_dir: Path,
    split: Split,
    out_dir: Path,
    shard: tuple[int, int] | None = None,
    on_tree: Callable[[SearchedTree], None] | None = None,
) -> EvalResults:
    from codeq.evaluate import evaluate
    from codeq.pipeline.verifier import evaluation_tie_break

    config, samples = _split_config(ctx.config, split)
    return evaluate(
        tasks_dir,
        out_dir,
        config,
        split=split,
        engine=load_policy(ctx, policy),
        policy=policy,  # type: ignore[arg-type]
        samples=samples,
        shard=shard,
        tie_break=evaluation_tie_break(ctx),
        on_tree=on_tree,
    )


# ------------------------------------------------------------------------------ promote


def promote_stage(ctx: StageContext) -> dict[str, Any]:
    """Make the candidate the run's current policy if the validation split says so (see
    codeq.promotion); write promote/decision.json either way."""
    from codeq.promotion import decide

    prefix = ctx.layout.stage("promote")
    run = _begin(ctx, prefix, "promote", inputs={"eval": ctx.layout.stage("eval")})
    if run.skipped:
        return run.skipped
    eval_dir = _download_stage(ctx, "eval", "evaluation", "promote-in")
    candidate = _optional_results(eval_dir / "candidate" / "validation")
    incumbent = _optional_results(eval_dir / "incumbent" / "validation")
    decision = decide(ctx.layout.round, candidate, incumbent, ctx.config.promotion)
    if decision.promote:
        assert decision.candidate is not None
        set_current(ctx, decision.candidate)
    elif current_pointer_round(ctx) == ctx.layout.round:
        # A forced rerun undoes this round's earlier promotion: back to the round's start.
        set_current(ctx, current_policy(ctx))
    log(f"promote: {decision.reason}")
    out_dir = ctx.workdir("promote")
    write_json(out_dir / "decision.json", decision.model_dump(mode="json"))
    ctx.store.put_dir(prefix, out_dir)
    return _finish(ctx, run, {"promote": decision.promote, "reason": decision.reason})


def _optional_results(folder: Path) -> EvalResults | None:
    return EvalResults.load(folder) if (folder / "results.json").is_file() else None


# ------------------------------------------------------------------------------ report


CURVE_FILES = (
    ("eval", "incumbent/test/results.json"),
    ("eval", "candidate/test/results.json"),
    ("promote", "decision.json"),
)


def learning_curve(ctx: StageContext, found: dict[str, Path]) -> list[dict[str, Any]]:
    """The run so far on the test split: the policy its first round started from, then each
    round's candidate, marked promoted or kept out by validation (a round that trained none
    has no point). Earlier rounds' files come from the store; `found` holds this round's."""
    history: list[tuple[int, dict[str, Path]]] = []
    for number in range(ctx.layout.round):
        layout, files = ctx.layout.of_round(number), {}
        for stage, name in CURVE_FILES:
            prefix = layout.stage(stage)
            target = ctx.workdir(f"report-in/history/round-{number}/{stage}") / name
            if ctx.store.is_complete(prefix) and ctx.store.get_verified_file(prefix, name, target):
                files[f"{stage}/{name}"] = target
        history.append((number, files))
    history.append((ctx.layout.round, found))
    points: list[dict[str, Any]] = []
    for number, files in history:
        start = files.get("eval/incumbent/test/results.json")
        if not points and start is not None:
            points.append(_curve_point(f"before round {number}", start, None))
        candidate = files.get("eval/candidate/test/results.json")
        decision_file = files.get("promote/decision.json")
        if candidate is not None and decision_file is not None:
            decision = json.loads(decision_file.read_text())
            points.append(_curve_point(f"round {number}", candidate, decision))
    return points


def _curve_point(label: str, path: Path, decision: dict[str, Any] | None) -> dict[str, Any]:
    """One policy's test-split rates; for a candidate, whether validation promoted it and the
    gate mode's gained / lost tasks and p."""
    from codeq.promotion import ModeComparison, gate_figures

    results = EvalResults.load(path)
    gate = (decision or {}).get("comparisons") or [None]
    return {
        "label": label,
        "policy": results.policy.id if results.policy else None,
        "promoted": None if decision is None else bool(decision["promote"]),
        "validation": None
        if gate[0] is None
        else gate_figures(ModeComparison.model_validate(gate[0])),
        "modes": {
            mode: Rate.model_validate(stats.model_dump(include=set(Rate.model_fields))).model_dump()
            for mode, stats in results.modes.items()
        },
    }


def report_stage(ctx: StageContext) -> dict[str, Any]:
    """Render report.json, report.md and index.html from the round's test-split evaluation,
    training metrics, pair statistics and promotion decision."""
    prefix = ctx.layout.stage("report")
    stages = {name: ctx.layout.stage(name) for name in ("pairs", "adapter", "eval", "promote")}
    run = _begin(ctx, prefix, "report", inputs=stages)
    if run.skipped:
        return run.skipped
    inputs = ctx.workdir("report-in")
    wanted = {
        "pairs": ["stats.json"],
        "adapter": ["metrics.json"],
        "eval": ["candidate/test/results.json", "incumbent/test/results.json", "verifier.json"],
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
    from codeq.promotion import PromotionDecision
    from codeq.report import render_report

    decision = PromotionDecision.model_validate_json(found["promote/decision.json"].read_text())
    curve = learning_curve(ctx, found)
    out_dir = ctx.workdir("report")
    examples = _example_fixes(ctx, inputs, "candidate" if decision.candidate else "incumbent")
    log("report: rendering report.json, report.md and index.html")
    index = render_report(
        out_dir,
        results=found.get("eval/candidate/test/results.json"),
        base_results=found.get("eval/incumbent/test/results.json"),
        train_metrics=found.get("adapter/metrics.json"),
        pair_stats=found.get("pairs/stats.json"),
        verifier=found.get("eval/verifier.json"),
        decision=decision,
        learning_curve=curve,
        examples=examples,
        stages=stage_rows(ctx),
        title=f"CodeQ run {ctx.layout.run}, round {ctx.layout.round}",
    )
    write_json(out_dir / "decision.json", decision.model_dump(mode="json"))
    ctx.store.put_dir(prefix, out_dir)
    info = {"index": ctx.store.describe(join_key(prefix, index.name)), "promoted": decision.promote}
    return _finish(ctx, run, info)


def _example_fixes(ctx: StageContext, inputs: Path, role: str) -> list[dict[str, Any]]:
    """Three test tasks the candidate (the incumbent when no candidate) solved: the diff from
    the buggy program to the one the model returned, in its primary mode."""
    from codeq.report.examples import example_diffs

    prefix = ctx.layout.stage("eval")
    results_path = inputs / "eval" / role / "test" / "results.json"
    if not results_path.is_file():
        return []
    results = EvalResults.load(results_path)
    name = f"{role}/test/trajectories-{results.primary_mode}.jsonl"
    target = inputs / "eval" / name
    if not ctx.store.get_verified_file(prefix, name, target):
        return []
    per_task = results.primary().per_task
    return example_diffs(read_jsonl(target, Trajectory), per_task)


def stage_rows(ctx: StageContext) -> list[dict[str, Any]]:
    """One row per completed stage of the round (each collect and evaluate shard its own): wall
    seconds and the config fingerprint its marker records."""
    prefixes = [("prepare", ctx.layout.stage("tasks"))]
    shards = join_key(ctx.layout.round_prefix, "trajectories")
    for key in ctx.store.list(shards):
        if key.endswith(f"/{MARKER_NAME}") and key.count("/") == shards.count("/") + 2:
            shard = key.rsplit("/", 2)[1]
            prefixes.append((f"collect {shard}", key.rsplit("/", 1)[0]))
    for stage, name in (("verifier", "verifier"), ("pairs", "pairs"), ("train", "adapter")):
        prefixes.append((stage, ctx.layout.stage(name)))
    eval_shards = ctx.layout.stage(EVAL_SHARDS)
    for key in ctx.store.list(eval_shards):
        if key.endswith(f"/{MARKER_NAME}") and key.count("/") == eval_shards.count("/") + 2:
            prefixes.append((f"evaluate {key.rsplit('/', 2)[1]}", key.rsplit("/", 1)[0]))
    prefixes.append(("evaluate", ctx.layout.stage("eval")))
    prefixes.append(("promote", ctx.layout.stage("promote")))
    rows = []
    for stage, prefix in prefixes:
        if not ctx.store.is_complete(prefix):
            continue
        marker = ctx.store.marker(prefix)
        fingerprint = marker.get("fingerprint") or {}
        rows.append(
            {
                "stage": stage,
                "seconds": marker.get("seconds"),
                "fingerprint": fingerprint.get("sha256"),
            }
        )
    return rows


def verifier_stage(ctx: StageContext) -> dict[str, Any]:
    """Train the round's learned verifier (codeq.pipeline.verifier; a round runs it after
    collect when verifier.enabled: `round_stages`)."""
    from codeq.pipeline.verifier import verifier_stage as train_round_verifier

    return train_round_verifier(ctx)


def round_stages(config: CodeQConfig) -> list[str]:
    """The stages a round runs, in order: STAGES, and the verifier after collect unless
    verifier.enabled is false."""
    from codeq.pipeline.verifier import round_stages as with_verifier

    return with_verifier(STAGES, config)


StageFunction = Callable[..., dict[str, Any]]
STAGE_FUNCTIONS: dict[str, StageFunction] = {
    "prepare": prepare_stage,
    "collect": collect_stage,
    "verifier": verifier_stage,
    "pairs": pairs_stage,
    "train": train_stage,
    "evaluate": evaluate_stage,
    "promote": promote_stage,
    "report": report_stage,
}
