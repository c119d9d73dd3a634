"""Evaluation that cannot flatter us: every mode on the same tasks, the search sees visible tests
only, and exactly one returned program per task is scored on all its tests (visible and hidden:
a program that fails a statement example is not a fix, whatever the hidden tests say).

Modes: zero_shot (one greedy rewrite from a minimal prompt), full_rewrite (one greedy rewrite, agent
prompt), mcts, bon, mt_bon (multi-turn best-of-N). Budgets come from one run each, read at smaller
budgets: MCTS limited to b rollouts is the final program from the nodes of rollouts <= b (MCTS is
sequential, so that prefix is exactly a budget-b search), and multi-turn best-of-N limited to t
turns likewise; best-of-n is the best of the first n samples of one best-of-N run (each sample has
its own seeded random stream, so those n are exactly a best-of-n run). Best-of-N is run with at
least as many samples as the largest MCTS budget (and every multi-turn budget) writes, so they can
be compared at equal numbers of programs. CodeQ's optimistic "any node passed" figure is reported
apart.

A single-answer mode can also sample k answers per task beside its greedy one (promotion's
paired test on pass counts, promotion.samples): the same prompt at the search temperature, one
request of k, each sample from its own seeded stream, each scored on all the task's tests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codeq.config import SEARCH_MODE_OF, CodeQConfig, EvalMode, is_neutral
from codeq.errors import BadInputError, ConfigError
from codeq.evaluate.results import (
    AnyNodeResult,
    EvalResults,
    ModeResult,
    SampledPasses,
    Selection,
    Split,
    primary_mode,
)
from codeq.evaluate.stats import rate, summarize
from codeq.progress import progress_bar
from codeq.schemas import Lineage, Node, Task, Trajectory, read_jsonl, write_jsonl
from codeq.search.tree import TieBreak, critique_tie_break, final_answer, single_passes_alike
from codeq.shards import shard_of_groups

log = logging.getLogger(__name__)

ANY_NODE_LABEL = (
    "CodeQ's optimistic any-node figure: a task counts as solved when ANY program in the MCTS "
    "tree passes its tests, i.e. an oracle picks the answer. Not comparable to solve_rate, "
    "which scores the one program the search returns."
)
SINGLE_ANSWER_MODES: tuple[EvalMode, ...] = ("zero_shot", "full_rewrite")
# the modes whose trees follow the tie-break's choices (each turn refines the one it picks);
# every other mode's tree is the same under any tie-break, which only chooses its answer
STEERED_BY_TIE_BREAK: frozenset[str] = frozenset({"mt_bon"})
SAMPLES_SUFFIX = "-samples"  # trajectories-<mode>-samples.jsonl: a mode's sampled answers


def load_eval_tasks(
    tasks_path: str | Path,
    split: Split,
    max_tasks: int | None,
    shard: tuple[int, int] | None = None,
    group: int = 1,
) -> list[Task]:
    """The tasks of `split` (a .jsonl file, or the tasks folder holding `<split>.jsonl`); with
    `shard` (index, count), only that shard's whole groups of `group` tasks (maybe none)."""
    path = Path(tasks_path)
    if path.is_dir():
        path = path / f"{split}.jsonl"
    tasks = read_jsonl(path, Task)
    if max_tasks is not None:
        tasks = tasks[:max_tasks]
    if not tasks:
        raise BadInputError(f"{path} holds no tasks", hint="run `codeq prepare` first")
    no_hidden = [task.task_id for task in tasks if not task.hidden_tests]
    if no_hidden:
        raise BadInputError(
            f"{len(no_hidden)} {split} tasks have no hidden tests (e.g. {no_hidden[0]})",
            hint="evaluation scores on hidden tests; rebuild tasks with `codeq prepare`",
        )
    if shard is not None:
        tasks = shard_of_groups(tasks, *shard, group)
    return tasks


def rewrites_within_budget(trajectory: Trajectory, budget: int) -> list[Node]:
    """MCTS: the rewrites created by rollouts <= budget."""
    return [n for n in trajectory.nodes if n.parent is not None and n.rollout <= budget]


def first_samples(trajectory: Trajectory, n: int) -> list[Node]:
    """Best-of-N: the first n samples (node ids 1..n, in sampling order)."""
    return [node for node in trajectory.nodes if node.parent is not None][:n]


def final_program(trajectory: Trajectory) -> str:
    by_id = {node.id: node for node in trajectory.nodes}
    return by_id[trajectory.final_node].program


def fully_passed(tasks: Sequence[Task], programs: Sequence[str], sandbox: Any) -> dict[str, bool]:
    """Score one program per task on all its tests (visible + hidden); task_id -> passed."""
    from codeq.tasks import score_programs

    verdicts = score_programs(list(zip(tasks, programs, strict=True)), "all", sandbox)
    return {task.task_id: verdict.passed for task, verdict in zip(tasks, verdicts, strict=True)}


def _load_engine(config: CodeQConfig, adapter: str | Path | None) -> Any:
    from codeq.policy import load_policy
    from codeq.policy.source import require_adapter_dir

    policy = config.policy
    if adapter is not None:
        policy = policy.model_copy(update={"adapter": str(require_adapter_dir(adapter))})
    return load_policy(policy, seed=config.tasks.seed)


def evaluate(
    tasks_path: str | Path,
    out_dir: str | Path,
    config: CodeQConfig,
    *,
    split: Split = "test",
    adapter: str | Path | None = None,
    engine: Any = None,
    sandbox: Any = None,
    policy: Lineage | None = None,
    samples: Mapping[str, int] | None = None,
    tie_break: TieBreak | None = None,
    shard: tuple[int, int] | None = None,
    on_tree: Callable[[SearchedTree], None] | None = None,
) -> EvalResults:
    """Run every configured mode on the same tasks of `split`; write out_dir/results.json (and
    each mode's trajectories) and return the results. `policy` records what was evaluated.
    `samples` (mode -> k) adds k sampled answers per task to single-answer modes. `tie_break`
    replaces the critique among candidates that pass as many visible tests (`run_search`).
    `shard` (index, count) evaluates that shard's whole search groups of the tasks only
    (codeq.shards.shard_of_groups); codeq.evaluate.shards merges the shards' folders into the
    one a single process writes. `on_tree` is handed every tree as it is finished, with the
    resume state it joins (a stage saves them elsewhere; `merge_resume` puts them back)."""
    from codeq.sandbox import Sandbox

    out_dir = Path(out_dir)
    sampled = {mode: k for mode, k in (samples or {}).items() if k}
    for mode in sampled:
        if mode not in SINGLE_ANSWER_MODES or mode not in config.evaluate.modes:
            raise ConfigError(
                f"cannot sample answers in {mode!r}: only an evaluated single-answer mode "
                f"({', '.join(SINGLE_ANSWER_MODES)}) has a greedy answer to sample beside",
                hint="make promotion.modes start with zero_shot or full_rewrite",
            )
    tasks = load_eval_tasks(
        tasks_path, split, config.evaluate.max_tasks, shard, config.search.parallel_trees
    )
    if not tasks:
        raise BadInputError(
            f"evaluation shard {shard} gets none of the {split} tasks",
            hint="use fewer shards or a smaller search.parallel_trees (shards take whole groups)",
        )
    if engine is None:
        engine = _load_engine(config, adapter)
    run = _Evaluation(
        tasks, out_dir, config, engine, split, adapter, policy, sampled, tie_break, on_tree
    )
    if sandbox is None:
        with Sandbox(config.sandbox) as owned_sandbox:
            return run.all_modes(owned_sandbox)
    return run.all_modes(sandbox)


class _Evaluation:
    """One policy on one split: each mode searched, its returned programs scored."""

    def __init__(
        self,
        tasks: list[Task],
        out_dir: Path,
        config: CodeQConfig,
        engine: Any,
        split: Split,
        adapter: str | Path | None,
        policy: Lineage | None,
        samples: Mapping[str, int],
        tie_break: TieBreak | None = None,
        on_tree: Callable[[SearchedTree], None] | None = None,
    ) -> None:
        self.tasks, self.out_dir, self.config, self.engine = tasks, out_dir, config, engine
        self.split, self.adapter, self.policy = split, adapter, policy
        self.samples = samples
        self.tie_break = tie_break or critique_tie_break
        self.on_tree = on_tree
        self.budgets = sorted({*config.evaluate.rollout_ablation, config.search.rollouts})
        rewrites = config.search.rewrites_per_expansion
        sizes = {rewrites * b for b in self.budgets} | {config.search.bon_samples}
        self.turns = list(range(1, config.search.mt_bon_turns + 1))
        if "mt_bon" in config.evaluate.modes:  # best-of-N at each multi-turn budget's programs
            sizes |= {config.search.mt_bon_samples * turns for turns in self.turns}
        self.bon_sizes = sorted(sizes)

    def all_modes(self, sandbox: Any) -> EvalResults:
        probes = self.config.evaluate.agreement_probes
        if probes:  # it runs programs, so it is made where the sandbox is
            from codeq.search.agreement import AgreementTieBreak

            self.tie_break = AgreementTieBreak(
                sandbox, probes, self.config.search.seed, then=self.tie_break
            )
        modes = list(dict.fromkeys(self.config.evaluate.modes))
        results = EvalResults(
            model=self.config.policy.model,
            adapter=str(self.adapter) if self.adapter is not None else self.config.policy.adapter,
            policy=self.policy,
            split=self.split,
            task_ids=[task.task_id for task in self.tasks],
            primary_mode=primary_mode(modes),
            confidence=self.config.evaluate.confidence,
            seed=self.config.search.seed,
            modes={},
        )
        single_pass: tuple[EvalMode, list[Trajectory], float] | None = None
        for mode in modes:
            if single_pass is not None and mode in SINGLE_ANSWER_MODES and self._alike():
                trajectories, seconds = self._reuse(single_pass, mode)
            else:
                trajectories, seconds = self._search(mode, sandbox)
            if mode in SINGLE_ANSWER_MODES and single_pass is None:
                single_pass = (mode, trajectories, seconds)
            write_jsonl(self.out_dir / f"trajectories-{mode}.jsonl", trajectories)
            if mode == "mcts":
                self._add_mcts(results, trajectories, seconds, sandbox)
            elif mode == "bon":
                self._add_bon(results, trajectories, seconds, sandbox)
            elif mode == "mt_bon":
                self._add_mt_bon(results, trajectories, seconds, sandbox)
            else:
                picked = [[n for n in t.nodes if n.parent is not None] for t in trajectories]
                extra = {}
                if self.samples.get(mode):
                    extra["sampled"] = self._sampled(mode, self.samples[mode], sandbox)
                results.modes[mode] = self._score(trajectories, picked, seconds, sandbox, **extra)
            log.info(
                "%s on %d %s tasks: solve rate %.3f",
                mode,
                len(self.tasks),
                self.split,
                results.modes[mode].solve_rate,
            )
        results.save(self.out_dir / "results.json")
        return results

    def _alike(self) -> bool:
        return single_passes_alike(self.tasks, self.config.search.prompt)

    def _reuse(
        self, done: tuple[EvalMode, list[Trajectory], float], mode: EvalMode
    ) -> tuple[list[Trajectory], float]:
        """`mode`'s trees when it asks what the single pass already run asked (zero_shot and
        full_rewrite under search.prompt 'plain'): that mode's trees under this mode's name,
        with their tokens and time, instead of writing the same programs again."""
        other, trajectories, seconds = done
        log.info(
            "%s asks every task what %s asked (search.prompt %r): its answers are %s's, not "
            "generated again",
            mode,
            other,
            self.config.search.prompt,
            other,
        )
        return [t.model_copy(update={"mode": mode}) for t in trajectories], seconds

    def _search(self, mode: EvalMode, sandbox: Any) -> tuple[list[Trajectory], float]:
        """Search every task in `mode`, resumably (`_resumable`)."""
        from codeq.search import run_search

        rollouts = None
        if mode == "mcts":
            rollouts = max(self.budgets)
        elif mode == "bon":
            rollouts = max(self.bon_sizes)
        elif mode == "mt_bon":
            rollouts = max(self.turns)
        config = self._search_config(mode, rollouts)

        def run(finished: Callable[[Trajectory], None], done: Collection[str]) -> None:
            run_search(
                self.tasks,
                self.engine,
                sandbox,
                config,
                on_trajectory=finished,
                done=done,
                tie_break=self.tie_break,
            )

        trajectories, seconds = self._resumable(mode, self._resume_key(mode, rollouts), run)
        if mode not in STEERED_BY_TIE_BREAK:
            trajectories = self._answered(trajectories)
        return trajectories, seconds

    def _answered(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Each tree with the answer this evaluation's tie-break chooses: a tree searched
        before (under another round's verifier, or another evaluation's) is answered again,
        not searched again. The trees are in self.tasks' order."""
        answered = []
        for task, trajectory in zip(self.tasks, trajectories, strict=True):
            nodes = trajectory.nodes
            answer = final_answer(nodes[1:], nodes[0], task, self.tie_break)
            if answer.id != trajectory.final_node:
                trajectory = trajectory.model_copy(update={"final_node": answer.id})
            answered.append(trajectory)
        return answered

    def _resumable(
        self,
        label: str,
        key: str,
        run: Callable[[Callable[[Trajectory], None], Collection[str]], None],
    ) -> tuple[list[Trajectory], float]:
        """Every task's tree from `run(on_trajectory, done)`. Each finished tree is appended
        to a partial file at once, so an interrupted evaluation resumes with the tasks it has
        not searched yet (a deterministic search redoes the rest of the task group it was
        stopped in, so the trees are those of an uninterrupted run)."""
        resume = _ModeResume(self.out_dir, label, key)
        remaining = [task for task in self.tasks if task.task_id not in resume.done]
        if len(remaining) < len(self.tasks):
            log.info(
                "%s: resuming, %d of %d tasks already searched (%s)",
                label,
                len(self.tasks) - len(remaining),
                len(self.tasks),
                resume.partial,
            )
        started = time.perf_counter()
        with progress_bar(len(self.tasks), f"evaluate {label} ({self.split})") as bar:
            bar.update(len(self.tasks) - len(remaining))

            def finished(trajectory: Trajectory) -> None:
                state = resume.record(trajectory, time.perf_counter() - started)
                if self.on_tree is not None:
                    self.on_tree(SearchedTree(label, state, trajectory))
                bar.update(1)

            run(finished, set(resume.done))
        trajectories = [resume.done[task.task_id] for task in self.tasks]
        return trajectories, resume.seconds_before + time.perf_counter() - started

    def _sampled(self, mode: EvalMode, k: int, sandbox: Any) -> SampledPasses:
        """k answers per task to the prompt `mode` answers greedily, sampled at the search
        temperature in one request (each sample from its own seeded stream), each scored on
        all the task's tests. Their trees are resumable and reused like a mode's."""
        from dataclasses import replace

        from codeq.search import SearchSettings, sandbox_scorer, search

        label = f"{mode}{SAMPLES_SUFFIX}"
        greedy = SearchSettings.resolve(
            self._search_config(mode, None), model=getattr(self.engine, "name", "")
        )
        settings = replace(
            greedy,
            rewrites=k,
            temperature=self.config.search.temperature,
            top_p=self.config.search.top_p,
        )

        def run(finished: Callable[[Trajectory], None], done: Collection[str]) -> None:
            scorer = sandbox_scorer(sandbox)
            search(self.tasks, self.engine, scorer, settings, on_trajectory=finished, done=done)

        trajectories, _ = self._resumable(label, self._resume_key(label, None, samples=k), run)
        write_jsonl(self.out_dir / f"trajectories-{label}.jsonl", trajectories)
        passes = self._passes(trajectories, sandbox)
        return SampledPasses(
            samples=k,
            temperature=settings.temperature,
            top_p=settings.top_p,
            per_task=passes,
            pass_rate=sum(passes.values()) / (k * len(self.tasks)),
        )

    def _passes(self, trajectories: list[Trajectory], sandbox: Any) -> dict[str, int]:
        """How many of each task's rewrites pass all its tests (visible and hidden); each
        distinct valid program is run once, an invalid rewrite (empty, unchanged) fails."""
        from codeq.tasks import score_programs

        items = [
            (task, program)
            for task, trajectory in zip(self.tasks, trajectories, strict=True)
            for program in sorted({node.program for node in trajectory.nodes[1:] if node.valid})
        ]
        verdicts = score_programs(items, "all", sandbox)
        passing = {
            (task.task_id, program)
            for (task, program), verdict in zip(items, verdicts, strict=True)
            if verdict.passed
        }
        return {
            task.task_id: sum(
                node.valid and (task.task_id, node.program) in passing
                for node in trajectory.nodes[1:]
            )
            for task, trajectory in zip(self.tasks, trajectories, strict=True)
        }

    def _search_config(self, mode: EvalMode, rollouts: int | None) -> CodeQConfig:
        """The config `mode` searches with: its search mode, rewarded by the visible tests only,
        sized for the largest budget this evaluation reads (MCTS rollouts, best-of-N's N,
        multi-turn best-of-N's turns)."""
        search: dict[str, Any] = {"mode": SEARCH_MODE_OF[mode], "reward_tests": "visible"}
        if mode == "mcts":
            search["rollouts"] = rollouts
        elif mode == "bon":
            search["bon_samples"] = rollouts
        elif mode == "mt_bon":
            search["mt_bon_turns"] = rollouts
        return self.config.derive(search=search)

    def _resume_key(self, mode: str, rollouts: int | None, samples: int | None = None) -> str:
        """What must match for searched trees to be reused: policy, search settings, mode (and
        the number of sampled answers; the tie-break only where it steers the search)."""
        described: dict[str, Any] = {
            "mode": mode,
            "split": self.split,
            "rollouts": rollouts,
            "policy": self.policy.model_dump(mode="json") if self.policy else None,
            "adapter": str(self.adapter) if self.adapter is not None else None,
            "model": self.config.policy.model_dump(mode="json"),
            "search": {
                key: value
                for key, value in self.config.search.model_dump(mode="json").items()
                if not is_neutral(f"search.{key}", value)
            },
        }
        if samples is not None:  # only sampled answers' keys have it: earlier keys are unchanged
            described["samples"] = samples
        steered = mode in STEERED_BY_TIE_BREAK
        if steered and self.tie_break is not critique_tie_break:  # another's trees differ
            tie_break = self.tie_break
            described["tie_break"] = getattr(tie_break, "__qualname__", type(tie_break).__name__)
        encoded = json.dumps(described, sort_keys=True).encode()
        return hashlib.sha256(encoded).hexdigest()[:16]

    def _score(
        self,
        trajectories: list[Trajectory],
        candidates: list[list[Node]],
        seconds: float,
        sandbox: Any,
        **extra: Any,
    ) -> ModeResult:
        """Score the program each task returns when it may pick only from its `candidates`
        (all its rewrites, or those of a smaller budget)."""
        programs = [
            final_answer(nodes, trajectory.nodes[0], task, self.tie_break).program
            for task, trajectory, nodes in zip(self.tasks, trajectories, candidates, strict=True)
        ]
        solved = fully_passed(self.tasks, programs, sandbox)
        written = sum(len(nodes) for nodes in candidates)
        whole_run = written == sum(len(t.nodes) - 1 for t in trajectories)
        cost: dict[str, Any] = {}
        if whole_run:  # tokens and time are known for the whole search, not for its prefixes
            cost = {
                "completion_tokens": sum(t.completion_tokens for t in trajectories),
                "prompt_tokens": sum(t.prompt_tokens for t in trajectories),
                "seconds": round(seconds, 2),
            }
        return ModeResult(
            **summarize(self.tasks, solved, self.config.evaluate.confidence),
            programs=written / len(self.tasks),
            **cost,
            **extra,
        )

    def _add_mcts(
        self, results: EvalResults, trajectories: list[Trajectory], seconds: float, sandbox: Any
    ) -> None:
        for budget in self.budgets:
            candidates = [rewrites_within_budget(t, budget) for t in trajectories]
            results.mcts_rollout_ablation[str(budget)] = self._score(
                trajectories, candidates, seconds, sandbox, rollouts=budget
            )
        full = str(self.config.search.rollouts)
        results.mcts_rollout_ablation[full] = self._with_selection(
            results.mcts_rollout_ablation[full], trajectories, sandbox
        )
        results.modes["mcts"] = results.mcts_rollout_ablation[full]
        selection = results.modes["mcts"].selection
        assert selection is not None
        # the tasks some rewrite solves: a rewrite failing a visible test fails them all
        passed = {task.task_id: task.task_id in selection.solvable for task in self.tasks}
        results.any_node_passed = AnyNodeResult(
            label=ANY_NODE_LABEL,
            **rate(sum(passed.values()), len(self.tasks), self.config.evaluate.confidence),
            per_task=passed,
        )

    def _add_bon(
        self, results: EvalResults, trajectories: list[Trajectory], seconds: float, sandbox: Any
    ) -> None:
        for size in self.bon_sizes:
            candidates = [first_samples(t, size) for t in trajectories]
            results.bon_ablation[str(size)] = self._score(
                trajectories, candidates, seconds, sandbox, samples=size
            )
        full = str(self.config.search.bon_samples)
        results.bon_ablation[full] = self._with_selection(
            results.bon_ablation[full], trajectories, sandbox
        )
        results.modes["bon"] = results.bon_ablation[full]

    def _add_mt_bon(
        self, results: EvalResults, trajectories: list[Trajectory], seconds: float, sandbox: Any
    ) -> None:
        samples = self.config.search.mt_bon_samples
        for turns in self.turns:  # turn t's samples are the nodes of rollout t
            candidates = [rewrites_within_budget(t, turns) for t in trajectories]
            results.mt_bon_ablation[str(turns)] = self._score(
                trajectories, candidates, seconds, sandbox, rollouts=turns, samples=samples
            )
        full = str(max(self.turns))
        results.mt_bon_ablation[full] = self._with_selection(
            results.mt_bon_ablation[full], trajectories, sandbox
        )
        results.modes["mt_bon"] = results.mt_bon_ablation[full]

    def _with_selection(
        self, result: ModeResult, trajectories: list[Trajectory], sandbox: Any
    ) -> ModeResult:
        """`result` with how its answers were chosen: every distinct rewrite that passes all
        the visible tests is run on all the task's tests too (one that fails a visible test
        cannot pass them all), so the tasks an oracle's choice would solve are known."""
        from codeq.tasks import score_programs

        items = [
            (task, program)
            for task, trajectory in zip(self.tasks, trajectories, strict=True)
            for program in sorted(
                {
                    node.program
                    for node in trajectory.nodes[1:]
                    if node.valid and node.verdict is not None and node.verdict.passed
                }
            )
        ]
        verdicts = score_programs(items, "all", sandbox)
        solvable = {task.task_id for (task, _), v in zip(items, verdicts, strict=True) if v.passed}
        ordered = [task.task_id for task in self.tasks if task.task_id in solvable]
        selection = Selection(
            visible_passing=len({task.task_id for task, _ in items}),
            solvable=ordered,
            lost=[task_id for task_id in ordered if not result.per_task[task_id]],
        )
        return result.model_copy(update={"selection": selection})


_RESUME_PREFIX, _RESUME_TREES, _RESUME_STATE = "trajectories-", ".partial.jsonl", ".partial.json"


def is_resume_file(name: str) -> bool:
    """Whether a file of an evaluation's folder is a mode's resume state (its searched trees or
    their key): copied into another evaluation's folder, it is used only where the key matches."""
    return name.startswith(_RESUME_PREFIX) and name.endswith((_RESUME_TREES, _RESUME_STATE))


class _ModeResume:
    """The trees one mode has finished so far: trajectories-<mode>.partial.jsonl plus a small
    state file holding the key they were searched under and the seconds spent. A different key
    (another policy or search setting) starts the mode over."""

    def __init__(self, out_dir: Path, mode: str, key: str) -> None:
        self.partial = out_dir / f"{_RESUME_PREFIX}{mode}{_RESUME_TREES}"
        self.state = out_dir / f"{_RESUME_PREFIX}{mode}{_RESUME_STATE}"
        self.key = key
        self.done: dict[str, Trajectory] = {}
        self.seconds_before = 0.0
        state = self._read_state()
        if state.get("key") == key and self.partial.is_file():
            self.done = _read_complete_lines(self.partial)
            self.seconds_before = float(state.get("seconds", 0.0))
            write_jsonl(self.partial, self.done.values())  # drops a line a crash cut short
        else:
            self.partial.unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)

    def _read_state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state.read_text()))
        except (OSError, ValueError):
            return {}

    def record(self, trajectory: Trajectory, seconds_now: float) -> dict[str, Any]:
        """Adds a finished tree; returns the state written beside the trees."""
        write_jsonl(self.partial, [trajectory], append=True)
        self.done[trajectory.task_id] = trajectory
        state = {"key": self.key, "seconds": round(self.seconds_before + seconds_now, 2)}
        self.state.write_text(json.dumps(state) + "\n")
        return state


@dataclass(frozen=True)
class SearchedTree:
    """A tree an evaluation has just finished: `label` names the resume state it joins (a
    mode, or <mode>-samples), `state` that state now (the key it is valid under, seconds)."""

    label: str
    state: dict[str, Any]
    trajectory: Trajectory


def merge_resume(
    out_dir: Path, label: str, state: Mapping[str, Any], trees: Sequence[Trajectory]
) -> int:
    """Trees saved elsewhere (`SearchedTree`s kept by a stage) put back into `label`'s resume
    state in out_dir, so the evaluation skips their tasks: added to the trees out_dir holds under
    the same key, replacing any under another. Returns how many tasks were added."""
    resume = _ModeResume(out_dir, label, str(state["key"]))
    added = [tree for tree in trees if tree.task_id not in resume.done]
    if added:
        write_jsonl(resume.partial, added, append=True)
    seconds = max(resume.seconds_before, float(state.get("seconds", 0.0)))
    resume.state.write_text(json.dumps({"key": resume.key, "seconds": seconds}) + "\n")
    return len(added)


def _read_complete_lines(path: Path) -> dict[str, Trajectory]:
    """Every whole record of a partial file; a line cut short by a crash ends the reading."""
    done: dict[str, Trajectory] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            trajectory = Trajectory.model_validate_json(line)
        except ValueError:
            break
        done[trajectory.task_id] = trajectory
    return done
