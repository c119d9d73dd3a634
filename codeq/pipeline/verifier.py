"""The round's learned verifier in the pipeline: the verifier stage that trains it (after
collect, on every program collect wrote), the one rule for a stage that asks for it (loaded
once, refused on another base model, missing -> error or the self-critique as verifier.fallback
says), and the record of what it did at evaluation (eval/verifier.json)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codeq.config import CodeQConfig
from codeq.errors import CorruptInputError, MissingInputError, VerifierMissingError
from codeq.logs import log
from codeq.pipeline.context import (
    StageContext,
    begin,
    completed_shards,
    download_tasks,
    finish,
    recorded_shards,
    restore_checkpoint,
)
from codeq.pipeline.policies import base_policy
from codeq.schemas import Lineage, Task, Trajectory, read_jsonl, write_json

if TYPE_CHECKING:
    from codeq.pairs import RewriteScorer
    from codeq.verifier import Program, Verifier, VerifierTieBreak

STAGE = "verifier"
PROGRESS = "verifier-progress"  # a stopped verifier stage's last checkpoint
RECORD = "verifier.json"  # in eval/: which scorer chose the answers, the verifier's AUC
SCORES = "q_ai.json"  # in the verifier's output: its score of every rewrite the round collected


def round_stages(stages: list[str], config: CodeQConfig) -> list[str]:
    """A round's stages: `stages`, with the verifier after collect when verifier.enabled."""
    if not config.verifier.enabled:
        return list(stages)
    after = stages.index("collect") + 1
    return [*stages[:after], STAGE, *stages[after:]]


def uses_verifier(config: CodeQConfig) -> bool:
    """Whether the round's evaluation depends on its verifier (its tie-break, or its AUC)."""
    return config.verifier.enabled or config.evaluate.tie_break == "verifier"


# ------------------------------------------------------------------------------ the stage


def verifier_stage(ctx: StageContext) -> dict[str, Any]:
    """Train the round's verifier on its base model from every distinct valid program the
    round's collect wrote (and, with verifier.earlier_rounds, the collects of the run's rounds
    before it), labelled by all the train tasks' tests (the sandbox runs those a search
    rewarded by visible tests only). With nothing to learn from (every program passed, or none
    did) the marker records `trained: false`, and a stage that asks for the verifier errs or
    falls back (verifier.fallback). A stopped stage resumes training from the last checkpoint
    it kept in the store (verifier.checkpoint_every_s)."""
    from codeq.train.checkpoints import CheckpointTarget
    from codeq.verifier import (
        Verifier,
        distinct_programs,
        label_unknown,
        nothing_to_learn,
        train_verifier,
    )

    prefix = ctx.layout.stage(STAGE)
    keeping = ctx.store.is_complete(prefix) and not ctx.force
    shards = learned_shards(ctx, prefix, keeping)
    run = begin(ctx, prefix, STAGE, inputs=learned_inputs(ctx, shards))
    if run.skipped:
        return run.skipped
    programs: list[Program] = []
    writers: dict[str, Lineage] = {}
    for number, indexes in shards.items():
        written, trajectories, tasks = round_programs(round_context(ctx, number), indexes)
        programs += written
        writers.update((t.policy.id, t.policy) for t in trajectories if t.policy is not None)
        if number == ctx.layout.round:  # this round's rewrites: those pairs takes Q_ai for
            own_trajectories, own_tasks = trajectories, tasks
    programs = distinct_programs(programs)
    if any(item.passed is None for item in programs):
        from codeq.sandbox import Sandbox

        log("verifier: running the programs a search rewarded by visible tests on all tests")
        with Sandbox(ctx.config.sandbox) as sandbox:
            programs = label_unknown(programs, sandbox)
    reason = nothing_to_learn(programs)
    if reason is not None:
        log(f"verifier: {reason}; no verifier is trained this round")
        empty = ctx.workdir("verifier-empty")
        write_json(empty / "metrics.json", {"trained": False, "reason": reason})
        ctx.store.put_dir(prefix, empty)
        return finish(ctx, run, {"trained": False, "reason": reason})
    base = base_policy(ctx)
    log(
        f"verifier: learning from {len(programs)} programs of round(s) "
        f"{', '.join(map(str, shards))} on {base.describe()}"
    )
    out_dir = ctx.workdir("verifier-train")
    progress = ctx.layout.stage(PROGRESS)
    resume_from = restore_checkpoint(ctx, run, progress)
    metrics = train_verifier(
        programs,
        out_dir,
        ctx.config,
        base=base,
        written_by=next(iter(writers.values())) if len(writers) == 1 else None,
        round_number=ctx.layout.round,
        rounds=list(shards),
        writers=list(writers.values()),
        checkpoints=CheckpointTarget(ctx.config.store, progress, run.fingerprint.to_json()),
        resume_from=resume_from,
    )
    folder = out_dir / "verifier"
    write_json(folder / "metrics.json", metrics)
    verifier = Verifier.load(folder, ctx.config, base)
    ctx.engines[f"verifier:{prefix}"] = verifier  # a local round's later stages use it as it is
    scores = rewrite_scores(verifier, own_trajectories, own_tasks)
    write_json(folder / SCORES, scores)
    ctx.store.put_dir(prefix, folder)
    info = {
        "trained": True,
        "programs": metrics["verifier"]["programs"],
        "scored_rewrites": sum(map(len, scores.values())),
        "rounds": list(shards),
        "heldout_auc": metrics["heldout_auc"],
        "base": base.id,
        "resumed_from_step": metrics["resumed_from_step"],
    }
    finished = finish(ctx, run, info)
    ctx.store.delete_prefix(progress)  # the verifier is complete: its checkpoints are spent
    return finished


def round_context(ctx: StageContext, number: int) -> StageContext:
    """`ctx` as round `number` of the same run: its keys and its own scratch folders."""
    return replace(ctx, config=ctx.config.as_round(number))


def learned_shards(ctx: StageContext, prefix: str, keeping: bool) -> dict[int, list[int]]:
    """Round -> the collect shards the verifier learns from: this round's (those a kept output
    was built from), then each of the verifier.earlier_rounds rounds before it whose collect
    finished (one that did not is left out, with a line saying why)."""
    shards = {ctx.layout.round: recorded_shards(ctx, prefix) if keeping else completed_shards(ctx)}
    first = max(0, ctx.layout.round - ctx.config.verifier.earlier_rounds)
    for number in range(first, ctx.layout.round):
        earlier = round_context(ctx, number)
        try:
            earlier.store.require_complete(earlier.layout.stage("tasks"), "tasks (prepare)")
            shards[number] = completed_shards(earlier)
        except MissingInputError as exc:
            log(f"verifier: round {number}'s programs are left out: {exc}")
    return dict(sorted(shards.items()))


def learned_inputs(ctx: StageContext, shards: dict[int, list[int]]) -> dict[str, str]:
    """The stage's fingerprinted inputs: each round's collect shards and tasks (this round's
    named as before earlier rounds were learned from, so its outputs since stay valid)."""
    inputs: dict[str, str] = {}
    for number, indexes in shards.items():
        layout = ctx.layout.of_round(number)
        named = "" if number == ctx.layout.round else f"round {number} "
        inputs |= {f"{named}collect shard {index}": layout.shard(index) for index in indexes}
        inputs[f"{named}tasks"] = layout.stage("tasks")
    return inputs


def round_programs(
    ctx: StageContext, shards: list[int]
) -> tuple[list[Program], list[Trajectory], dict[str, Task]]:
    """The distinct valid programs round `ctx` collected in `shards` (labelled where their
    search saw all tests), the trajectories they come from and the round's train tasks."""
    from codeq.verifier import written_programs

    tasks = {t.task_id: t for t in read_jsonl(download_tasks(ctx) / "train.jsonl", Task)}
    trajectories: list[Trajectory] = []
    for index in shards:
        shard_dir = ctx.workdir(f"verifier-in/shard-{index}")
        ctx.store.get_dir(ctx.layout.shard(index), shard_dir)
        trajectories += read_jsonl(shard_dir / "trajectories.jsonl", Trajectory)
    limit = ctx.config.verifier.max_programs_per_task
    return written_programs(trajectories, tasks, limit), trajectories, tasks


def rewrite_scores(
    verifier: Verifier, trajectories: list[Trajectory], tasks: dict[str, Task]
) -> dict[str, dict[str, float]]:
    """Task id -> node id -> the verifier's score of each valid rewrite of `trajectories`:
    Q_ai for the pairs stage, which then needs no model (nor a GPU) of its own."""
    scores: dict[str, dict[str, float]] = {}
    for trajectory in trajectories:
        rewrites = [node for node in trajectory.nodes[1:] if node.valid]
        task = tasks[trajectory.task_id]
        values = verifier.score([(task, node.program) for node in rewrites])
        scores[trajectory.task_id] = {str(n.id): v for n, v in zip(rewrites, values, strict=True)}
    return scores


# ------------------------------------------------------------------------------ using it


def _missing(ctx: StageContext) -> str | None:
    """Why the round has no verifier to use (None when it has one)."""
    prefix = ctx.layout.stage(STAGE)
    if not ctx.store.is_complete(prefix):
        if not ctx.config.verifier.enabled:
            return "verifier.enabled is false, so none was trained"
        # the key, not the store's location: eval/verifier.json is the same in every store
        return f"its verifier stage has not finished (no {prefix}/_COMPLETE)"
    marker = ctx.store.marker(prefix)
    if not marker.get("trained", True):
        return f"none was trained: {marker.get('reason', 'nothing to learn from')}"
    return None


def available_verifier(ctx: StageContext) -> tuple[Verifier | None, str | None]:
    """The round's verifier (loaded once per round, refused by VerifierLineageError when it
    was trained on another base model than the run's), or None and why there is none."""
    from codeq.verifier import Verifier

    reason = _missing(ctx)
    if reason is not None:
        return None, reason
    prefix = ctx.layout.stage(STAGE)
    key = f"verifier:{prefix}"
    if key not in ctx.engines:
        folder = ctx.workdir("verifier-model")
        ctx.store.get_dir(prefix, folder)
        ctx.engines[key] = Verifier.load(folder, ctx.config, base_policy(ctx))
    return ctx.engines[key], None


def required_verifier(ctx: StageContext, asked_by: str) -> Verifier | None:
    """The verifier a stage asks for by `asked_by` (a config key set to 'verifier'); when the
    round has none, None if verifier.fallback is 'critique' (the self-critique is used), else
    VerifierMissingError naming the lineage asked for."""
    verifier, reason = available_verifier(ctx)
    if verifier is not None:
        return verifier
    critique_stands_in(
        ctx.config,
        asked_by,
        reason or "none was found",
        whose=f"round {ctx.layout.round}",
        wanted=lambda: base_policy(ctx),
        hint="set verifier.enabled=true (the verifier stage trains one after collect), or "
        "verifier.fallback=critique to use the self-critique where there is none",
    )
    return None


def critique_stands_in(
    config: CodeQConfig,
    asked_by: str,
    reason: str,
    *,
    whose: str,
    wanted: Callable[[], Lineage],
    hint: str,
) -> None:
    """The one rule for a verifier asked for (`asked_by`=verifier) where there is none
    (`reason`), in a round's stage or a command alike: the self-critique stands in where
    verifier.fallback is 'critique', and says so; else VerifierMissingError naming the lineage
    asked for (`wanted`, called only then: fingerprinting the base reads its files)."""
    if config.verifier.fallback == "critique":
        log(f"{asked_by} asks for a learned verifier but {reason}: the self-critique is used")
        return
    raise VerifierMissingError(
        f"{whose} asks for a learned verifier on {wanted().describe()} "
        f"({asked_by}=verifier), but it has none: {reason}",
        hint=hint,
    )


def pairs_q_ai(ctx: StageContext) -> RewriteScorer | None:
    """Q_ai from the round's verifier for the pairs stage (pairs.q_ai=verifier): the scores
    its stage wrote of every rewrite (the model itself only for an output from before it did;
    None where the self-critique stands in, verifier.fallback)."""
    recorded = recorded_scores(ctx)
    if recorded is not None:
        return recorded
    verifier = required_verifier(ctx, "pairs.q_ai")
    if verifier is None:
        return None
    tasks = {t.task_id: t for t in read_jsonl(download_tasks(ctx) / "train.jsonl", Task)}

    def score(trajectory: Trajectory, nodes: Any) -> list[float]:
        task = tasks.get(trajectory.task_id)
        if task is None:
            raise CorruptInputError(
                f"trajectory of task {trajectory.task_id} has no task in the round's train tasks",
                hint="rerun the round from collect",
            )
        return verifier.score([(task, node.program) for node in nodes])

    return score


def recorded_scores(ctx: StageContext) -> RewriteScorer | None:
    """The verifier stage's scores of the round's rewrites as a scorer, its lineage checked
    (None when the round has no verifier, or its output holds no scores)."""
    from codeq.verifier.model import VERIFIER_FILE, check_lineage, read_info

    prefix = ctx.layout.stage(STAGE)
    if _missing(ctx) is not None:
        return None
    folder = ctx.workdir("verifier-scores")
    if not ctx.store.get_verified_file(prefix, SCORES, folder / SCORES):
        return None
    ctx.store.get_verified_file(prefix, VERIFIER_FILE, folder / VERIFIER_FILE)
    check_lineage(read_info(folder), base_policy(ctx), ctx.store.describe(prefix))
    table = json.loads((folder / SCORES).read_text(encoding="utf-8"))

    def score(trajectory: Trajectory, nodes: Any) -> list[float]:
        scored = table.get(trajectory.task_id, {})
        missing = [node.id for node in nodes if str(node.id) not in scored]
        if missing:
            raise CorruptInputError(
                f"{ctx.store.describe(prefix)} holds no verifier score of task "
                f"{trajectory.task_id}'s rewrites {missing[:5]}",
                hint="rerun the round's verifier stage (--force) on this round's collect",
            )
        return [float(scored[str(node.id)]) for node in nodes]

    return score


def evaluation_tie_break(ctx: StageContext) -> VerifierTieBreak | None:
    """What breaks ties among answers at evaluation: the verifier's tie-break when
    evaluate.tie_break is 'verifier' (None: the self-critique)."""
    if ctx.config.evaluate.tie_break != "verifier":
        return None
    verifier = required_verifier(ctx, "evaluate.tie_break")
    return verifier.tie_break() if verifier is not None else None


def record_evaluation(ctx: StageContext, tasks_dir: Path, out_dir: Path) -> dict[str, Any] | None:
    """eval/verifier.json: which scorer chose among answers tied on the visible tests, and the
    verifier's AUC (with the self-critique's beside it, where its rewrites were critiqued) on
    every distinct rewrite the evaluation wrote on validation tasks, each run on all its tests.
    None (nothing written) when the round uses neither a verifier nor execution agreement."""
    agreement = ctx.config.evaluate.agreement_probes
    verifier_used = uses_verifier(ctx.config)
    if not verifier_used and not agreement:
        return None
    from codeq.search.agreement import ANSWERED_FIRST, ranking_of
    from codeq.verifier import program_auc

    if verifier_used:
        verifier, reason = available_verifier(ctx)
    else:  # the record still says agreement chose first, then the self-critique
        verifier, reason = None, "the round uses no verifier (verifier.enabled is false)"
    asked = ctx.config.evaluate.tie_break
    chose = "verifier" if asked == "verifier" and verifier is not None else "critique"
    record: dict[str, Any] = {"tie_break": chose, "tie_break_asked": asked, "missing": reason}
    if agreement:  # absent at 0, as in records made before it
        record["agreement_probes"] = agreement
        record["agreement_ranking"] = ranking_of(ANSWERED_FIRST)  # what evaluate's tie-break does
    if verifier is not None:
        record["verifier"] = verifier.info.model_dump(mode="json")
        validation = tasks_dir / "validation.jsonl"
        tasks = read_jsonl(validation, Task) if validation.is_file() else []
        files = sorted(out_dir.glob("*/validation/trajectories-*.jsonl"))
        trajectories = [
            t
            for path in files
            if ".partial." not in path.name
            for t in read_jsonl(path, Trajectory)
        ]
        from codeq.sandbox import Sandbox

        with Sandbox(ctx.config.sandbox) as sandbox:
            record["validation"] = program_auc(tasks, trajectories, verifier, sandbox)
        log(f"evaluate: the verifier's AUC on validation rewrites: {record['validation']['auc']}")
    write_json(out_dir / RECORD, record)
    return record


def describe(record: dict[str, Any] | None) -> dict[str, Any]:
    """The eval summary's view of eval/verifier.json."""
    if record is None:
        return {}
    validation = record.get("validation") or {}
    return {
        "verifier": {
            "tie_break": record["tie_break"],
            "validation_auc": validation.get("auc"),
            "validation_programs": validation.get("programs"),
        }
    }
