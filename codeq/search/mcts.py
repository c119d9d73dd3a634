"""The search loop: many task trees advanced together so every generate call gets full batches.

Each iteration does, for every active tree at once: select a node by UCB1, ask the policy for K
rewrites of it (one batched generate call for all trees), extract and test every rewrite (one
sandbox batch), ask the policy to critique every valid rewrite (one more batched call), and back
up the pass fraction. Finished trees leave and waiting tasks take their place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from codeq.config import CodeQConfig
from codeq.policy.critique import SCORE_PREFIX, critique_request, q_ai_from
from codeq.policy.engine import GenerationRequest, GenerationResult
from codeq.policy.prompts import extract_program, is_valid_rewrite
from codeq.schemas import Task, TestSplit, Trajectory, Verdict
from codeq.search.tree import SearchSettings, Tree, reward_of

if TYPE_CHECKING:
    from codeq.sandbox import Sandbox

Scorer = Callable[[Sequence[tuple[Task, str]], TestSplit], list[Verdict]]
TrajectoryCallback = Callable[[Trajectory], None]


class Policy(Protocol):
    """What the search needs from a policy (PolicyEngine, or a scripted stand-in in tests)."""

    name: str

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...


def sandbox_scorer(sandbox: Sandbox) -> Scorer:
    """The production scorer: `codeq.tasks.score_programs` on the given sandbox."""
    from codeq.tasks import score_programs

    def score(items: Sequence[tuple[Task, str]], which: TestSplit) -> list[Verdict]:
        return score_programs(items, which, sandbox)

    return score


def run_search(
    tasks: Sequence[Task],
    engine: Policy,
    sandbox: Sandbox | None,
    config: CodeQConfig,
    *,
    mode: str | None = None,
    reward_tests: str | None = None,
    rollouts: int | None = None,
    on_trajectory: TrajectoryCallback | None = None,
    scorer: Scorer | None = None,
) -> list[Trajectory]:
    """Search every task; one trajectory per task, in task order.

    mode: 'mcts' | 'bon' | 'greedy' | 'plain' (default config.search.mode); reward_tests:
    'all' | 'visible' (default config.search.reward_tests); rollouts: MCTS expansions per tree
    (for 'bon': N). `on_trajectory` is called as soon as each tree finishes. `scorer` replaces
    the sandbox scorer (tests)."""
    settings = SearchSettings.resolve(
        config,
        mode=mode,
        reward_tests=reward_tests,
        rollouts=rollouts,
        model=getattr(engine, "name", ""),
    )
    if scorer is None:
        if sandbox is None:
            from codeq.errors import ConfigError

            raise ConfigError("run_search needs a sandbox (or a scorer) to test rewrites")
        scorer = sandbox_scorer(sandbox)
    return search(tasks, engine, scorer, settings, on_trajectory=on_trajectory)


def search(
    tasks: Sequence[Task],
    policy: Policy,
    scorer: Scorer,
    settings: SearchSettings,
    *,
    on_trajectory: TrajectoryCallback | None = None,
) -> list[Trajectory]:
    """Advance up to `settings.parallel_trees` trees together until every task is searched."""
    waiting: deque[tuple[int, Task]] = deque(enumerate(tasks))
    active: list[Tree] = []
    finished: dict[int, Trajectory] = {}
    while waiting or active:
        # 1. admit waiting tasks into free slots and test their buggy programs (the roots)
        admitted: list[Tree] = []
        while waiting and len(active) + len(admitted) < settings.parallel_trees:
            index, task = waiting.popleft()
            admitted.append(Tree(task=task, settings=settings, index=index))
        score_roots(admitted, scorer, settings.reward_tests)
        active.extend(admitted)

        # 2. select one node per tree by UCB1 and ask for K rewrites of each, in one call
        leaves = [tree.select() for tree in active]
        requests = [tree.expansion_request(leaf) for tree, leaf in zip(active, leaves, strict=True)]
        results = policy.generate(requests)

        # 3. extract each rewrite into a child node; invalid ones (empty/unchanged) stay untested
        new_nodes = []
        for tree, leaf, request, result in zip(active, leaves, requests, results, strict=True):
            tree.rollouts_done += 1
            tree.prompt_tokens += result.prompt_tokens
            tree.completion_tokens += sum(result.completion_tokens)
            for text in result.texts:
                program = extract_program(text)
                valid = is_valid_rewrite(program, leaf.program, tree.task.buggy_code)
                child = tree.add_child(leaf, list(request.messages), text, program, valid)
                new_nodes.append((tree, child))

        # 4. test every valid rewrite of every tree in one sandbox batch
        testable = [(tree, node) for tree, node in new_nodes if node.valid]
        verdicts = scorer(
            [(tree.task, node.program) for tree, node in testable], settings.reward_tests
        )
        for (_, node), verdict in zip(testable, verdicts, strict=True):
            node.verdict = verdict

        # 5. self-critique every valid rewrite in one batched call (Q_ai)
        if settings.critique:
            critique(testable, policy, settings)

        # 6. backpropagate each rewrite's pass fraction to the root
        for tree, node in new_nodes:
            tree.backpropagate(node, reward_of(node.verdict))

        # 7. retire finished trees (full pass or rollout budget spent)
        still_active = []
        for tree in active:
            if tree.done:
                trajectory = tree.trajectory()
                finished[tree.index] = trajectory
                if on_trajectory is not None:
                    on_trajectory(trajectory)
            else:
                still_active.append(tree)
        active = still_active
    return [finished[index] for index in range(len(tasks))]


def score_roots(trees: Sequence[Tree], scorer: Scorer, which: TestSplit) -> None:
    """Test the buggy programs; the root starts with one visit worth its pass fraction."""
    if not trees:
        return
    verdicts = scorer([(tree.task, tree.root.program) for tree in trees], which)
    for tree, verdict in zip(trees, verdicts, strict=True):
        tree.root.verdict = verdict
        tree.backpropagate(tree.root, reward_of(verdict))


def critique(nodes: Sequence[tuple[Tree, Any]], policy: Policy, settings: SearchSettings) -> None:
    """Ask the policy to score each program; parse the scores into Q_ai in [0, 1]."""
    if not nodes:
        return
    requests = [
        critique_request(
            node.prompt,
            node.completion,
            temperature=settings.critique_temperature,
            max_new_tokens=settings.critique_max_new_tokens,
        )
        for tree, node in nodes
    ]
    results = policy.generate(requests)
    for (tree, node), result in zip(nodes, results, strict=True):
        node.critique = SCORE_PREFIX + result.texts[0] if result.texts else ""
        node.q_ai = q_ai_from(result.texts, SCORE_PREFIX)
        tree.prompt_tokens += result.prompt_tokens
        tree.completion_tokens += sum(result.completion_tokens)
