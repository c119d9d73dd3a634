"""Evaluation that cannot flatter us: every mode on the same test tasks, the search sees visible
tests only, and exactly one final program per task is scored on the hidden tests.

Modes: zero_shot (one greedy rewrite from a minimal prompt), full_rewrite (one greedy rewrite, agent
prompt), mcts, bon. For mcts also: the rollout-budget ablation (the final program the search would
have returned after b rollouts, from the nodes created by rollouts <= b; MCTS is sequential, so that
prefix is exactly a budget-b search) and CodeQ's optimistic "any node passed" figure.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.errors import BadInputError
from codeq.evaluate.stats import rate, summarize
from codeq.schemas import Node, Task, Trajectory, read_jsonl, write_json, write_jsonl

SEARCH_MODE_OF = {"zero_shot": "plain", "full_rewrite": "greedy", "mcts": "mcts", "bon": "bon"}
ANY_NODE_LABEL = (
    "CodeQ's optimistic any-node figure: a task counts as solved when ANY program in the MCTS "
    "tree passes the hidden tests, i.e. an oracle picks the answer. Not comparable to solve_rate, "
    "which scores the one program the search returns."
)


def load_test_tasks(tasks_path: str | Path, max_tasks: int | None) -> list[Task]:
    path = Path(tasks_path)
    if path.is_dir():
        path = path / "test.jsonl"
    tasks = read_jsonl(path, Task)
    if max_tasks is not None:
        tasks = tasks[:max_tasks]
    if not tasks:
        raise BadInputError(f"{path} holds no tasks", hint="run `codeq prepare` first")
    no_hidden = [task.task_id for task in tasks if not task.hidden_tests]
    if no_hidden:
        raise BadInputError(
            f"{len(no_hidden)} test tasks have no hidden tests (e.g. {no_hidden[0]})",
            hint="evaluation scores on hidden tests; rebuild tasks with `codeq prepare`",
        )
    return tasks


def reward_key(node: Node) -> tuple[float, float, int, int]:
    """The search's own final-answer rule (codeq.search.tree.Tree.final_node): highest reward-test
    pass fraction, then critique score, then shallower, then earlier."""
    fraction = node.verdict.pass_fraction if node.verdict is not None else 0.0
    return fraction, node.q_ai or 0.0, -node.depth, -node.id


def final_node_within_budget(trajectory: Trajectory, budget: int) -> Node:
    """The program a search limited to `budget` rollouts would have returned."""
    candidates = [
        node
        for node in trajectory.nodes
        if node.parent is not None
        and node.rollout <= budget
        and node.valid
        and node.verdict is not None
    ]
    if not candidates:
        return trajectory.nodes[0]
    return max(candidates, key=reward_key)


def final_program(trajectory: Trajectory) -> str:
    by_id = {node.id: node for node in trajectory.nodes}
    return by_id[trajectory.final_node].program


def hidden_pass(tasks: Sequence[Task], programs: Sequence[str], sandbox: Any) -> dict[str, bool]:
    """Score one program per task on its hidden tests; task_id -> passed."""
    from codeq.tasks import score_programs

    verdicts = score_programs(list(zip(tasks, programs, strict=True)), "hidden", sandbox)
    return {task.task_id: verdict.passed for task, verdict in zip(tasks, verdicts, strict=True)}


def any_node_passed(
    tasks: Sequence[Task], trajectories: Sequence[Trajectory], sandbox: Any
) -> dict[str, bool]:
    """Whether any valid rewrite in each tree passes the hidden tests (each distinct program once)."""
    items: list[tuple[Task, str]] = []
    owners: list[str] = []
    for task, trajectory in zip(tasks, trajectories, strict=True):
        programs = {node.program for node in trajectory.nodes[1:] if node.valid}
        for program in sorted(programs):
            items.append((task, program))
            owners.append(task.task_id)
    from codeq.tasks import score_programs

    passed = dict.fromkeys((task.task_id for task in tasks), False)
    for owner, verdict in zip(owners, score_programs(items, "hidden", sandbox), strict=True):
        passed[owner] = passed[owner] or verdict.passed
    return passed


def primary_mode(modes: Sequence[str]) -> str:
    return "mcts" if "mcts" in modes else modes[0]


def _progress(message: str) -> None:
    print(f"[evaluate] {message}", file=sys.stderr, flush=True)


def _load_engine(config: CodeQConfig, adapter: str | Path | None) -> Any:
    from codeq.policy import PolicyEngine
    from codeq.train.model import check_adapter_dir

    policy = config.policy
    if adapter is not None:
        policy = policy.model_copy(update={"adapter": str(check_adapter_dir(adapter))})
    return PolicyEngine.load(policy, seed=config.tasks.seed)


def evaluate(
    tasks_path: str | Path,
    out_dir: str | Path,
    config: CodeQConfig,
    *,
    adapter: str | Path | None = None,
    engine: Any = None,
    sandbox: Any = None,
) -> dict[str, Any]:
    """Run every configured mode on the same test tasks; write out_dir/results.json (and each
    mode's trajectories) and return the results."""
    from codeq.sandbox import Sandbox

    out_dir = Path(out_dir)
    tasks = load_test_tasks(tasks_path, config.evaluate.max_tasks)
    if engine is None:
        engine = _load_engine(config, adapter)
    if sandbox is None:
        with Sandbox(config.sandbox) as owned_sandbox:
            return _evaluate_with(tasks, out_dir, config, engine, owned_sandbox, adapter)
    return _evaluate_with(tasks, out_dir, config, engine, sandbox, adapter)


def _evaluate_with(
    tasks: list[Task],
    out_dir: Path,
    config: CodeQConfig,
    engine: Any,
    sandbox: Any,
    adapter: str | Path | None,
) -> dict[str, Any]:
    from codeq.search import run_search

    confidence = config.evaluate.confidence
    modes = list(dict.fromkeys(config.evaluate.modes))
    results: dict[str, Any] = {
        "model": config.policy.model,
        "adapter": str(adapter) if adapter is not None else config.policy.adapter,
        "task_ids": [task.task_id for task in tasks],
        "primary_mode": primary_mode(modes),
        "confidence": confidence,
        "hidden_tests_only": True,
        "search_reward_tests": "visible",
        "modes": {},
    }
    budgets = sorted(set(config.evaluate.rollout_ablation))
    for mode in modes:
        rollouts = None
        if mode == "mcts":
            rollouts = max([config.search.rollouts, *budgets])
        _progress(f"{mode}: searching {len(tasks)} tasks")
        trajectories = run_search(
            tasks,
            engine,
            sandbox,
            config,
            mode=SEARCH_MODE_OF[mode],
            reward_tests="visible",
            rollouts=rollouts,
        )
        write_jsonl(out_dir / f"trajectories-{mode}.jsonl", trajectories)
        if mode == "mcts":
            _add_mcts_results(results, tasks, trajectories, config, sandbox, budgets)
            continue
        solved = hidden_pass(tasks, [final_program(t) for t in trajectories], sandbox)
        results["modes"][mode] = summarize(tasks, solved, confidence)
        _progress(f"{mode}: solve rate {results['modes'][mode]['solve_rate']:.3f}")
    write_json(out_dir / "results.json", results)
    return results


def _add_mcts_results(
    results: dict[str, Any],
    tasks: list[Task],
    trajectories: list[Trajectory],
    config: CodeQConfig,
    sandbox: Any,
    budgets: list[int],
) -> None:
    confidence = config.evaluate.confidence
    ablation: dict[str, Any] = {}
    for budget in sorted({*budgets, config.search.rollouts}):
        programs = [final_node_within_budget(t, budget).program for t in trajectories]
        ablation[str(budget)] = summarize(tasks, hidden_pass(tasks, programs, sandbox), confidence)
    results["modes"]["mcts"] = ablation[str(config.search.rollouts)]
    results["modes"]["mcts"]["rollouts"] = config.search.rollouts
    results["mcts_rollout_ablation"] = {str(b): ablation[str(b)] for b in budgets}
    any_passed = any_node_passed(tasks, trajectories, sandbox)
    results["any_node_passed"] = {
        "label": ANY_NODE_LABEL,
        **rate(sum(any_passed.values()), len(tasks), confidence),
        "per_task": any_passed,
    }
    _progress(
        f"mcts: solve rate {results['modes']['mcts']['solve_rate']:.3f} "
        f"(any node passed: {results['any_node_passed']['solve_rate']:.3f})"
    )
