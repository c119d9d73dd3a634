"""`collect`: search one shard of a tasks file and append each trajectory as soon as it is done.

Resumable: task ids already in `out_path` are not written again, and a torn last line (a kill
during a write) is cut off before appending, so a restart never duplicates a task and loses at
most the tasks that were in flight. A deterministic search redoes the unfinished part of the
fixed task group it was stopped in (`codeq.search.mcts.search_groups`), so the resumed
collection holds the trees of an uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.progress import progress_bar
from codeq.schemas import Lineage, Task, Trajectory, read_jsonl, write_jsonl
from codeq.search.mcts import Policy, Scorer, TrajectoryCallback, run_search
from codeq.search.tree import TieBreak
from codeq.shards import shard_of

log = logging.getLogger(__name__)


def finished_task_ids(out_path: Path) -> set[str]:
    """Task ids with a complete record in `out_path`; cuts a torn (unterminated) last line."""
    if not out_path.is_file():
        return set()
    data = out_path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning("%s: dropping a torn last line (an interrupted write)", out_path)
        with out_path.open("r+b") as handle:
            handle.truncate(keep)
    return {trajectory.task_id for trajectory in read_jsonl(out_path, Trajectory)}


def collect(
    tasks_path: str | Path,
    out_path: str | Path,
    config: CodeQConfig,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    engine: Policy | None = None,
    lineage: Lineage | None = None,
    on_trajectory: TrajectoryCallback | None = None,
    scorer: Scorer | None = None,
    progress: bool = True,
    tie_break: TieBreak | None = None,
) -> dict[str, Any]:
    """Search the shard's tasks not yet in `out_path`; append one trajectory per task, each
    recording `lineage` (the searching policy; the configured base model when `engine` is
    loaded here from the config without an adapter), then hand it to `on_trajectory`.

    The search is config.search's (mode, rewards from reward_tests: 'all' on train tasks, at
    most max_tasks tasks of the shard; `tie_break` as in `run_search`). Returns a summary."""
    out_path = Path(out_path)
    tasks = shard_of(read_jsonl(tasks_path, Task), shard_index, shard_count)
    if config.search.max_tasks is not None:
        tasks = tasks[: config.search.max_tasks]
    done = finished_task_ids(out_path)
    todo = [task for task in tasks if task.task_id not in done]
    started = time.perf_counter()
    trajectories: list[Trajectory] = []
    if todo:
        if engine is None:
            from codeq.policy import load_policy

            engine = load_policy(config.policy, seed=config.tasks.seed)
            if lineage is None and config.policy.adapter is None:
                from codeq.train.lineage import base_lineage

                lineage = base_lineage(config.policy)
        trajectories = _search_and_append(
            tasks,
            done,
            out_path,
            config,
            engine,
            lineage,
            on_trajectory,
            scorer,
            progress,
            tie_break,
        )
    stats = summarize(trajectories, config, len(tasks), len(tasks) - len(todo), out_path, started)
    stats["policy"] = lineage.model_dump(mode="json") if lineage is not None else None
    return stats


def _search_and_append(
    tasks: list[Task],
    done: set[str],
    out_path: Path,
    config: CodeQConfig,
    engine: Policy,
    lineage: Lineage | None,
    on_trajectory: TrajectoryCallback | None,
    scorer: Scorer | None,
    progress: bool,
    tie_break: TieBreak | None,
) -> list[Trajectory]:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    bar = progress_bar(len(tasks), "collect", enabled=progress)
    bar.update(len(done))
    searched: list[bool] = []  # solved or not, each task this process searched

    def append(trajectory: Trajectory) -> None:
        trajectory.policy = lineage
        write_jsonl(out_path, [trajectory], append=True)
        if on_trajectory is not None:
            on_trajectory(trajectory)
        searched.append(trajectory.solved)
        bar.update(1)
        bar.set_postfix(solved=f"{sum(searched)} of {len(searched)}")

    try:
        if scorer is not None:
            return run_search(
                tasks,
                engine,
                None,
                config,
                on_trajectory=append,
                scorer=scorer,
                done=done,
                tie_break=tie_break,
            )
        from codeq.sandbox import Sandbox

        with Sandbox(config.sandbox) as sandbox:
            return run_search(
                tasks,
                engine,
                sandbox,
                config,
                on_trajectory=append,
                done=done,
                tie_break=tie_break,
            )
    finally:
        bar.close()


def summarize(
    trajectories: list[Trajectory],
    config: CodeQConfig,
    shard_tasks: int,
    skipped: int,
    out_path: Path,
    started: float,
) -> dict[str, Any]:
    seconds = time.perf_counter() - started
    prompt = sum(t.prompt_tokens for t in trajectories)
    completion = sum(t.completion_tokens for t in trajectories)
    solved = sum(t.solved for t in trajectories)
    return {
        "out": str(out_path),
        "mode": config.search.mode,
        "reward_tests": config.search.reward_tests,
        "shard_tasks": shard_tasks,
        "skipped": skipped,
        "searched": len(trajectories),
        "solved": solved,
        "solve_rate": round(solved / len(trajectories), 4) if trajectories else 0.0,
        "nodes": sum(len(t.nodes) for t in trajectories),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "seconds": round(seconds, 2),
        "completion_tokens_per_s": round(completion / seconds, 2) if seconds > 0 else 0.0,
    }
