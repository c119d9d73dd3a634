"""One evaluation from its shards. Each shard evaluated whole search groups of the same task list
(`evaluate(..., shard=...)`, codeq.shards.shard_of_groups), so its trees are the ones a single
process searches; merging the shards' folders writes the folder that process writes:
results.json recomputed over the whole task list from the shards' per-task outcomes (rates,
intervals, breakdowns, mean programs, token counts), every trajectory file in task order, and the
resume state a later round reuses. Only wall times differ: a merged search's `seconds` is its
slowest shard's (the shards run side by side)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codeq.errors import CorruptInputError
from codeq.evaluate.results import (
    AnyNodeResult,
    EvalResults,
    ModeResult,
    SampledPasses,
    Selection,
)
from codeq.evaluate.stats import rate, summarize
from codeq.schemas import Task

RESULTS_NAME = "results.json"
RESUME_STATE_SUFFIX = ".partial.json"  # a mode's resume key and seconds (codeq.evaluate.run)
TRAJECTORIES_SUFFIX = ".jsonl"  # one tree per line: trajectories-<mode>[-samples][.partial].jsonl
REBUILD_HINT = (
    "rerun evaluate for this round with --force (every shard with one shard count and one "
    "search.parallel_trees)"
)
# What every shard of one evaluation must agree on.
SHARED_FIELDS = (
    "model",
    "adapter",
    "policy",
    "split",
    "primary_mode",
    "confidence",
    "seed",
    "scored_on",
    "search_reward_tests",
)
# The results' per-mode tables (modes and every ablation): mode or budget -> ModeResult.
MODE_TABLES = tuple(
    name
    for name, field in EvalResults.model_fields.items()
    if field.annotation == dict[str, ModeResult]
)


def merge_results(parts: Sequence[EvalResults], tasks: Sequence[Task]) -> EvalResults:
    """The results one evaluation of `tasks` writes, from the results of its shards (each holds
    some of the tasks, every task in exactly one)."""
    _check_partition(parts, tasks)
    first = parts[0]
    for name in SHARED_FIELDS:
        values = {json.dumps(_plain(getattr(part, name)), sort_keys=True) for part in parts}
        if len(values) > 1:
            raise CorruptInputError(
                f"the {first.split} shards of one evaluation differ in {name}",
                hint=REBUILD_HINT,
            )
    tables: dict[str, dict[str, ModeResult]] = {}
    for table in MODE_TABLES:
        keys = [list(getattr(part, table)) for part in parts]
        if any(key != keys[0] for key in keys):
            raise CorruptInputError(
                f"the {first.split} shards of one evaluation hold different {table} ({keys})",
                hint=REBUILD_HINT,
            )
        tables[table] = {
            key: merge_mode([getattr(part, table)[key] for part in parts], tasks, first.confidence)
            for key in keys[0]
        }
    return EvalResults(
        **{name: getattr(first, name) for name in SHARED_FIELDS},
        task_ids=[task.task_id for task in tasks],
        **tables,
        any_node_passed=_merge_any_node(parts, tasks),
    )


def merge_mode(parts: Sequence[ModeResult], tasks: Sequence[Task], confidence: float) -> ModeResult:
    """One mode (or one budget of it) over all `tasks`, from its shards' results."""
    solved: dict[str, bool] = {}
    for part in parts:
        solved.update(part.per_task)
    # programs is a mean per task; times n it is the count of programs written (an integer)
    written = sum(round(part.programs * part.n) for part in parts)
    cost: dict[str, Any] = {}
    # a budget's cost is known only where it is the whole search, in every shard alike
    if all(part.seconds is not None for part in parts):
        cost = {
            "completion_tokens": sum(part.completion_tokens or 0 for part in parts),
            "prompt_tokens": sum(part.prompt_tokens or 0 for part in parts),
            "seconds": round(max(part.seconds or 0.0 for part in parts), 2),
        }
    first = parts[0]
    if any((part.rollouts, part.samples) != (first.rollouts, first.samples) for part in parts):
        raise CorruptInputError("the shards of one mode differ in budget", hint=REBUILD_HINT)
    return ModeResult(
        **summarize(tasks, solved, confidence),
        programs=written / len(tasks),
        **cost,
        rollouts=first.rollouts,
        samples=first.samples,
        sampled=_merge_sampled(parts, tasks),
        selection=_merge_selection(parts, tasks),
    )


def _merge_selection(parts: Sequence[ModeResult], tasks: Sequence[Task]) -> Selection | None:
    found = [part.selection for part in parts]
    if all(selection is None for selection in found):
        return None
    present = [selection for selection in found if selection is not None]
    if len(present) < len(found):
        raise CorruptInputError(
            "the shards of one mode differ: some recorded how their answers were chosen",
            hint=REBUILD_HINT,
        )
    solvable = {task_id for selection in present for task_id in selection.solvable}
    lost = {task_id for selection in present for task_id in selection.lost}
    order = [task.task_id for task in tasks]
    return Selection(
        visible_passing=sum(selection.visible_passing for selection in present),
        solvable=[task_id for task_id in order if task_id in solvable],
        lost=[task_id for task_id in order if task_id in lost],
    )


def _merge_sampled(parts: Sequence[ModeResult], tasks: Sequence[Task]) -> SampledPasses | None:
    sampled = [part.sampled for part in parts]
    if all(s is None for s in sampled):
        return None
    present = [s for s in sampled if s is not None]
    first = present[0]
    settings = {(s.samples, s.temperature, s.top_p) for s in present}
    if len(present) < len(sampled) or len(settings) > 1:
        raise CorruptInputError(
            "the shards of one mode differ in their sampled answers", hint=REBUILD_HINT
        )
    passes: dict[str, int] = {}
    for s in present:
        passes.update(s.per_task)
    per_task = {task.task_id: passes[task.task_id] for task in tasks}
    return SampledPasses(
        samples=first.samples,
        temperature=first.temperature,
        top_p=first.top_p,
        per_task=per_task,
        pass_rate=sum(per_task.values()) / (first.samples * len(tasks)),
    )


def _merge_any_node(parts: Sequence[EvalResults], tasks: Sequence[Task]) -> AnyNodeResult | None:
    found = [part.any_node_passed for part in parts]
    if all(result is None for result in found):
        return None
    present = [result for result in found if result is not None]
    if len(present) < len(found):
        raise CorruptInputError(
            "only some shards report the any-node figure (MCTS)", hint=REBUILD_HINT
        )
    passed: dict[str, bool] = {}
    for result in present:
        passed.update(result.per_task)
    per_task = {task.task_id: passed[task.task_id] for task in tasks}
    return AnyNodeResult(
        label=present[0].label,
        **rate(sum(per_task.values()), len(tasks), parts[0].confidence),
        per_task=per_task,
    )


def _check_partition(parts: Sequence[EvalResults], tasks: Sequence[Task]) -> None:
    """Every task in exactly one shard, and no other task."""
    if not parts:
        raise CorruptInputError("no evaluation shard to merge", hint=REBUILD_HINT)
    wanted = [task.task_id for task in tasks]
    held = [task_id for part in parts for task_id in part.task_ids]
    if sorted(held) != sorted(wanted):
        missing = sorted(set(wanted) - set(held))
        extra = sorted(set(held) - set(wanted))
        twice = sorted({task_id for task_id in held if held.count(task_id) > 1})
        problems = [
            f"{len(items)} {what} (e.g. {items[0]})"
            for items, what in ((missing, "missing"), (extra, "not asked for"), (twice, "twice"))
            if items
        ]
        raise CorruptInputError(
            f"the {parts[0].split} shards do not split its {len(wanted)} tasks: "
            f"{', '.join(problems)}",
            hint=REBUILD_HINT,
        )


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def merge_shard_folders(
    folders: Sequence[Path], out_dir: Path, tasks: Sequence[Task]
) -> EvalResults:
    """Merge the shards' folders of one evaluation (each as `evaluate(..., shard=...)` wrote
    it) into `out_dir`, as one `evaluate` of `tasks` writes it; return the merged results."""
    parts = [EvalResults.load(folder / RESULTS_NAME) for folder in folders]
    merged = merge_results(parts, tasks)
    order = [task.task_id for task in tasks]
    owned = [set(part.task_ids) for part in parts]
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sorted({path.name for folder in folders for path in folder.iterdir() if path.is_file()})
    for name in names:
        sources = [folder / name for folder in folders]
        if name == RESULTS_NAME:
            continue
        if name.endswith(RESUME_STATE_SUFFIX):
            _merge_resume_state(sources, out_dir / name)
        elif name.endswith(TRAJECTORIES_SUFFIX):
            _merge_trajectory_lines(sources, owned, order, out_dir / name)
        else:
            raise CorruptInputError(
                f"an evaluation shard holds {name}, which the merge does not know",
                hint="merge with the codeq version that evaluated the shards",
            )
    merged.save(out_dir / RESULTS_NAME)
    return merged


def _merge_trajectory_lines(
    sources: Sequence[Path], owned: Sequence[set[str]], order: Sequence[str], target: Path
) -> None:
    """Each shard's lines of the tasks it evaluated (its resume file may also hold trees an
    earlier round searched for other tasks), in task order, byte for byte. A finished mode's
    file must hold every task; a resume file may lack some."""
    lines: dict[str, str] = {}
    for source, tasks in zip(sources, owned, strict=True):
        if not source.is_file():
            continue
        for line in source.read_text(encoding="utf-8").splitlines():
            try:
                task_id = json.loads(line)["task_id"]
            except (ValueError, KeyError, TypeError):
                raise CorruptInputError(
                    f"{source} holds a line that is not a trajectory", hint=REBUILD_HINT
                ) from None
            if task_id in tasks:
                lines[task_id] = line
    partial = target.name.endswith(".partial" + TRAJECTORIES_SUFFIX)
    missing = [task_id for task_id in order if task_id not in lines]
    if missing and not partial:
        raise CorruptInputError(
            f"the shards' {target.name} lack {len(missing)} task(s) (e.g. {missing[0]})",
            hint=REBUILD_HINT,
        )
    merged = [lines[task_id] for task_id in order if task_id in lines]
    target.write_text("".join(line + "\n" for line in merged), encoding="utf-8")


def _merge_resume_state(sources: Sequence[Path], target: Path) -> None:
    """A mode's resume state: one key for every shard, the slowest shard's seconds."""
    states = [json.loads(source.read_text()) for source in sources if source.is_file()]
    keys = {state.get("key") for state in states}
    if len(keys) != 1:
        raise CorruptInputError(
            f"the shards searched {target.name.removesuffix(RESUME_STATE_SUFFIX)} under "
            "different settings",
            hint=REBUILD_HINT,
        )
    seconds = max(float(state.get("seconds", 0.0)) for state in states)
    target.write_text(json.dumps({"key": keys.pop(), "seconds": round(seconds, 2)}) + "\n")
