"""The search loop: many task trees advanced together so the generator always has full batches.

Each tree's search is written as a plain loop (`tree_search`): select a node by UCB1, ask the
policy for K rewrites of it, extract and test every rewrite, ask the policy to critique every
valid one, back up the pass fraction; until a full pass or the rollout budget. Multi-turn
best-of-N (`multi_turn_search`) is the same expansion of the previous turn's best instead of a
node chosen by UCB1. Where it needs the policy or the sandbox it yields what it needs and waits. `search` serves all trees at once:
their rewrites and critiques share one continuous batch (a tree's critiques join it as soon as
its rewrites are tested, not when every tree's are), their tests share each sandbox batch, and
finished trees leave while waiting tasks take their place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from codeq.config import CodeQConfig
from codeq.policy.critique import SCORE_PREFIX, critique_request, q_ai_from
from codeq.policy.prompts import extract_program, is_valid_rewrite
from codeq.policy.requests import GenerationRequest, GenerationResult
from codeq.schemas import Node, Task, TestSplit, Trajectory, Verdict, reward_of
from codeq.search.tree import SearchSettings, TieBreak, Tree, best_rewrite, request_seed

if TYPE_CHECKING:
    from codeq.sandbox import Sandbox

Scorer = Callable[[Sequence[tuple[Task, str]], TestSplit], list[Verdict]]
TrajectoryCallback = Callable[[Trajectory], None]


class Policy(Protocol):
    """What the search needs from a policy (PolicyEngine, or a scripted stand-in in tests).
    A policy with a `stream()` (continuous batching) is served through it; one with only
    `generate` answers, in one call per loop turn, every request its trees have made."""

    name: str

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...


class Stream(Protocol):
    """Continuous batching: requests in at any time, (ticket, result) out after any step."""

    @property
    def busy(self) -> bool: ...

    def submit(self, request: GenerationRequest) -> int: ...

    def step(self) -> list[tuple[int, GenerationResult]]: ...


class LockstepStream:
    """A stream over a policy that only has `generate`: each step answers everything submitted
    since the last one in a single call."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.pending: list[tuple[int, GenerationRequest]] = []
        self._next_ticket = 0

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def submit(self, request: GenerationRequest) -> int:
        self._next_ticket += 1
        self.pending.append((self._next_ticket, request))
        return self._next_ticket

    def step(self) -> list[tuple[int, GenerationResult]]:
        pending, self.pending = self.pending, []
        results = self.policy.generate([request for _, request in pending])
        return [(ticket, result) for (ticket, _), result in zip(pending, results, strict=True)]


def stream_of(policy: Policy) -> Stream:
    make = getattr(policy, "stream", None)
    return make() if callable(make) else LockstepStream(policy)


@dataclass(frozen=True)
class Generate:
    """A tree needs these requests completed; it is sent their results, in order."""

    requests: list[GenerationRequest]


@dataclass(frozen=True)
class Score:
    """A tree needs these programs tested on its reward tests; it is sent their verdicts."""

    programs: list[str]


TreeSteps = Generator[Generate | Score, Any, None]


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
    on_trajectory: TrajectoryCallback | None = None,
    scorer: Scorer | None = None,
    done: Collection[str] = (),
    tie_break: TieBreak | None = None,
) -> list[Trajectory]:
    """Search every task as config.search says (mode, reward_tests, rollouts or bon_samples)
    but those whose ids are in `done` (searched before an interruption); one trajectory per
    task searched, in task order. `on_trajectory` is called as soon as each tree finishes.
    `scorer` replaces the sandbox scorer (tests); `tie_break` the critique where rewrites
    pass as many reward tests (a learned verifier)."""
    settings = SearchSettings.resolve(config, model=getattr(engine, "name", ""))
    if tie_break is not None:
        settings = replace(settings, tie_break=tie_break)
    if scorer is None:
        if sandbox is None:
            from codeq.errors import ConfigError

            raise ConfigError("run_search needs a sandbox (or a scorer) to test rewrites")
        scorer = sandbox_scorer(sandbox)
    return search(tasks, engine, scorer, settings, on_trajectory=on_trajectory, done=done)


def tree_search(tree: Tree) -> TreeSteps:
    """One tree's whole search (MCTS; best-of-N is one expansion of the root). Yields what it
    needs from the policy or the sandbox."""
    # 1. test the buggy program: the root starts with one visit worth its pass fraction
    [tree.root.verdict] = yield Score([tree.root.program])
    tree.backpropagate(tree.root, reward_of(tree.root.verdict))
    while not tree.done:
        # 2. select a node by UCB1; 3-5. ask for K rewrites of it, test and critique them
        children = yield from expand(tree, tree.select())
        # 6. backpropagate each rewrite's pass fraction to the root
        for child in children:
            tree.backpropagate(child, reward_of(child.verdict))


def multi_turn_search(tree: Tree) -> TreeSteps:
    """Multi-turn best-of-N, as muCode searches: each turn samples N rewrites of one program
    (the buggy one first), tests and critiques them; the turn's best by reward tests, then the
    tie-break, is the next turn's program, its failing visible tests in the prompt
    (`Tree.prompt_for`). Up to T turns (`settings.rollouts`); stops at a full pass. A turn
    without a valid rewrite is asked again from the same program, with its own seed."""
    [tree.root.verdict] = yield Score([tree.root.program])
    tree.backpropagate(tree.root, reward_of(tree.root.verdict))
    current = tree.root
    while not tree.done:
        children = yield from expand(tree, current)
        for child in children:
            tree.record_own(child, reward_of(child.verdict))
        current = best_rewrite(children, tree.task, tree.settings.tie_break) or current


def expand(tree: Tree, leaf: Node) -> Generator[Generate | Score, Any, list[Node]]:
    """One rollout: K rewrites of `leaf` as its children, the valid ones tested on the reward
    tests and critiqued (Q_ai); returns the children."""
    settings = tree.settings
    request = tree.expansion_request(leaf)
    [result] = yield Generate([request])
    tree.rollouts_done += 1
    tree.count_tokens(result)
    # extract each rewrite into a child node; invalid ones (empty/unchanged) stay untested
    children = []
    for text in result.texts:
        program = extract_program(text)
        valid = is_valid_rewrite(program, leaf.program, tree.task.buggy_code)
        children.append(tree.add_child(leaf, list(request.messages), text, program, valid))
    testable = [child for child in children if child.valid]
    if testable:
        # test every valid rewrite on the reward tests
        verdicts = yield Score([child.program for child in testable])
        for child, verdict in zip(testable, verdicts, strict=True):
            child.verdict = verdict
        # the policy critiques every valid rewrite (Q_ai)
        if settings.critique:
            critiques = yield Generate([critique_of(tree, child) for child in testable])
            for child, critique in zip(testable, critiques, strict=True):
                child.critique = SCORE_PREFIX + critique.texts[0] if critique.texts else ""
                child.q_ai = q_ai_from(critique.texts, SCORE_PREFIX)
                tree.count_tokens(critique)
    return children


def critique_of(tree: Tree, node: Node) -> GenerationRequest:
    settings = tree.settings
    return critique_request(
        node.prompt,
        node.completion,
        temperature=settings.critique_temperature,
        max_new_tokens=settings.critique_max_new_tokens,
        seed=request_seed(settings.seed, tree.task.task_id, "critique", node.id),
    )


def search(
    tasks: Sequence[Task],
    policy: Policy,
    scorer: Scorer,
    settings: SearchSettings,
    *,
    on_trajectory: TrajectoryCallback | None = None,
    done: Collection[str] = (),
) -> list[Trajectory]:
    """Search every task not in `done`, up to `settings.parallel_trees` trees together; return
    their trajectories in task order.

    Deterministic settings (or a lockstep stand-in) test in turn with generation and search the
    tasks in fixed groups by position (`search_groups`), each group alone from an empty prefix
    cache. A group's batches then depend on its own tasks only, never on which tasks an earlier,
    interrupted run already finished: a group with some tasks `done` is searched whole again
    (those tasks' trees are not handed on), so stopping and resuming gives the trees of one
    uninterrupted run. Otherwise the remaining tasks stream through one loop and the sandbox
    tests in a background thread while the policy decodes (a GPU would otherwise idle during
    every sandbox batch)."""
    stream = stream_of(policy)
    lockstep = settings.deterministic or isinstance(stream, LockstepStream)
    skip = set(done)
    if not lockstep:
        remaining = [task for task in tasks if task.task_id not in skip]
        return _search_together(
            remaining, stream, scorer, settings, on_trajectory, ThreadPoolExecutor(1)
        )

    def hand_on(trajectory: Trajectory) -> None:
        if trajectory.task_id not in skip and on_trajectory is not None:
            on_trajectory(trajectory)

    searched: list[Trajectory] = []
    for group in search_groups(tasks, settings.parallel_trees):
        if all(task.task_id in skip for task in group):
            continue
        if settings.deterministic:
            forget = getattr(policy, "clear_prefix_cache", None)
            if callable(forget):
                forget()
        trees = _search_together(group, stream, scorer, settings, hand_on, None)
        searched += [trajectory for trajectory in trees if trajectory.task_id not in skip]
    return searched


def search_groups(tasks: Sequence[Task], size: int) -> list[list[Task]]:
    """The fixed groups a deterministic search takes its tasks in: consecutive runs of `size`
    tasks by position in the whole task list (never in what is left of it)."""
    return [list(tasks[start : start + size]) for start in range(0, len(tasks), size)]


def _search_together(
    tasks: Sequence[Task],
    stream: Stream,
    scorer: Scorer,
    settings: SearchSettings,
    on_trajectory: TrajectoryCallback | None,
    background: ThreadPoolExecutor | None,
) -> list[Trajectory]:
    """Advance `tasks`' trees together, finished trees leaving and waiting tasks taking their
    place, until every one is searched."""
    searching = _Searching(tasks, stream, scorer, settings, on_trajectory, background)
    try:
        while searching.waiting or searching.trees:
            # 1. admit waiting tasks into free slots (each first asks for its buggy program's test)
            searching.admit()
            # 2. hand back finished tests; start testing every program that trees wait on
            searching.score()
            # 3. one generation step; trees whose requests finished go on to their next need
            searching.generate()
    finally:
        if background is not None:
            background.shutdown(wait=True, cancel_futures=True)
    return [searching.finished[index] for index in range(len(tasks))]


class _Searching:
    """The state of one `search`: trees in flight, what each waits for, finished trajectories."""

    def __init__(
        self,
        tasks: Sequence[Task],
        stream: Stream,
        scorer: Scorer,
        settings: SearchSettings,
        on_trajectory: TrajectoryCallback | None,
        background: ThreadPoolExecutor | None,
    ) -> None:
        self.waiting: deque[tuple[int, Task]] = deque(enumerate(tasks))
        self.stream, self.scorer, self.settings = stream, scorer, settings
        self.on_trajectory = on_trajectory
        self.background = background
        self.trees: dict[int, tuple[Tree, TreeSteps]] = {}
        self.to_score: list[tuple[int, Score]] = []
        self.scoring: tuple[list[tuple[int, Score]], Future[list[Verdict]]] | None = None
        self.tickets: dict[int, tuple[int, int]] = {}  # ticket -> (tree index, position)
        self.answers: dict[int, list[Any]] = {}  # tree index -> results so far of its Generate
        self.finished: dict[int, Trajectory] = {}

    def admit(self) -> None:
        while self.waiting and len(self.trees) < self.settings.parallel_trees:
            index, task = self.waiting.popleft()
            tree = Tree(task=task, settings=self.settings, index=index)
            steps = multi_turn_search(tree) if tree.settings.mode == "mt_bon" else tree_search(tree)
            self.trees[index] = (tree, steps)
            self._resume(index, None)

    def score(self) -> None:
        """Start testing every program that trees wait on (all trees' in one batch) unless a
        batch is in test; hand back a batch's verdicts once it is done, waiting for it only
        when nothing can be decoded meanwhile."""
        if self.scoring is None and self.to_score:
            batch, self.to_score = self.to_score, []
            items = [(self.trees[i][0].task, code) for i, need in batch for code in need.programs]
            self.scoring = (batch, self._test(items))
        if self.scoring is not None and (self.scoring[1].done() or not self.stream.busy):
            batch, future = self.scoring
            self.scoring = None
            verdicts = iter(future.result())
            for index, need in batch:
                self._resume(index, [next(verdicts) for _ in need.programs])

    def _test(self, items: list[tuple[Task, str]]) -> Future[list[Verdict]]:
        which = self.settings.reward_tests
        if self.background is not None:
            return self.background.submit(self.scorer, items, which)
        done: Future[list[Verdict]] = Future()
        done.set_result(self.scorer(items, which))
        return done

    def generate(self) -> None:
        if not self.stream.busy:
            return
        for ticket, result in self.stream.step():
            index, position = self.tickets.pop(ticket)
            answers = self.answers[index]
            answers[position] = result
            if all(answer is not None for answer in answers):
                del self.answers[index]
                self._resume(index, answers)

    def _resume(self, index: int, answer: Any) -> None:
        """Send a tree what it waited for; note what it needs next, or retire it."""
        tree, steps = self.trees[index]
        try:
            need = steps.send(answer)
        except StopIteration:
            del self.trees[index]
            trajectory = tree.trajectory()
            self.finished[index] = trajectory
            if self.on_trajectory is not None:
                self.on_trajectory(trajectory)
            return
        if isinstance(need, Score):
            self.to_score.append((index, need))
            return
        self.answers[index] = [None] * len(need.requests)
        for position, request in enumerate(need.requests):
            self.tickets[self.stream.submit(request)] = (index, position)
