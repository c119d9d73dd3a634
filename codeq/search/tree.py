"""One task's search tree: nodes, UCB1 selection, expansion prompts, backpropagation, the final
answer. Pure bookkeeping; the loop that advances many trees together is in `codeq.search.mcts`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from codeq.config import SEARCH_MODES, CodeQConfig, SearchMode, eval_mode_of
from codeq.policy.prompts import (
    fenced,
    first_turn_messages,
    one_turn_refine_messages,
    plain_messages,
    refine_messages,
    visible_failures,
)
from codeq.policy.requests import GenerationRequest, GenerationResult
from codeq.schemas import ChatMessage, Node, Task, TestSplit, Trajectory, reward_of

TieBreak = Callable[[Task, Sequence[Node]], list[float]]
"""Scores of one task's tested rewrites (higher: more likely to pass every test), one per node:
what chooses among rewrites that pass as many reward tests (the final answer, a multi-turn
turn's best). The default reads the self-critique (`critique_tie_break`); a learned verifier
plugs in here (`run_search(..., tie_break=...)`, `evaluate(..., tie_break=...)`)."""


def critique_tie_break(task: Task, nodes: Sequence[Node]) -> list[float]:
    """The self-critique's Q_ai of each node (0 where it was not critiqued)."""
    return [node.q_ai or 0.0 for node in nodes]


@dataclass(frozen=True)
class SearchSettings:
    """Everything one search run needs, resolved from the config."""

    mode: SearchMode
    reward_tests: TestSplit
    rollouts: int
    rewrites: int
    temperature: float
    top_p: float
    max_depth: int
    exploration: float
    stop_on_pass: bool
    parallel_trees: int
    max_new_tokens: int
    critique: bool
    critique_temperature: float
    critique_max_new_tokens: int
    # no defaults here: the config's (search.prompt, .refine, .widening) are the only ones
    prompt: str
    refine: str
    widening: float
    seed: int = 0
    deterministic: bool = True
    model: str = ""
    tie_break: TieBreak = critique_tie_break

    @classmethod
    def resolve(cls, config: CodeQConfig, *, model: str = "") -> SearchSettings:
        """The settings config.search and config.policy give (a caller that needs others
        derives a config: `config.derive(search={...})`)."""
        from codeq.errors import ConfigError

        search, policy = config.search, config.policy
        chosen = search.mode
        if chosen not in SEARCH_MODES:
            raise ConfigError(
                f"unknown search mode {chosen!r}", hint=f"use one of {', '.join(SEARCH_MODES)}"
            )
        reward = search.reward_tests
        if reward not in ("all", "visible"):
            raise ConfigError(
                f"reward_tests must be 'all' or 'visible', not {reward!r}",
                hint="hidden tests alone never reward a search",
            )
        common = {
            "reward_tests": reward,
            "exploration": search.exploration,
            "stop_on_pass": search.stop_on_pass,
            "parallel_trees": search.parallel_trees,
            "max_new_tokens": policy.max_new_tokens,
            "critique_temperature": policy.critique_temperature,
            "critique_max_new_tokens": policy.critique_max_new_tokens,
            "seed": search.seed,
            "deterministic": search.deterministic,
            "model": model,
            "prompt": search.prompt,
            "refine": search.refine,
            "widening": search.widening,
        }
        if chosen in ("mcts", "bon", "mt_bon"):
            sampled = {
                "temperature": search.temperature,
                "top_p": search.top_p,
                "critique": policy.critique,
                **common,
            }
            if chosen == "mcts":
                return cls(
                    mode="mcts",
                    rollouts=search.rollouts,
                    rewrites=search.rewrites_per_expansion,
                    max_depth=search.max_depth,
                    **sampled,  # type: ignore[arg-type]
                )
            if chosen == "mt_bon":  # a turn is one expansion (rollout) of N samples, one deeper
                turns = search.mt_bon_turns
                return cls(
                    mode="mt_bon",
                    rollouts=turns,
                    rewrites=search.mt_bon_samples,
                    max_depth=turns,
                    **sampled,  # type: ignore[arg-type]
                )
            return cls(mode="bon", rollouts=1, rewrites=search.bon_samples, max_depth=1, **sampled)  # type: ignore[arg-type]
        # the single-rewrite modes: one greedy rewrite, no critique
        return cls(
            mode=chosen,
            rollouts=1,
            rewrites=1,
            temperature=0.0,
            top_p=1.0,
            max_depth=1,
            critique=False,
            **common,  # type: ignore[arg-type]
        )


def single_passes_alike(tasks: Sequence[Task], prompt: str) -> bool:
    """Whether the greedy single pass with first-turn prompt `prompt` ('full_rewrite') asks
    every task exactly what the plain single pass ('zero_shot') asks: then, both greedy and
    without a critique, they write the same programs (true of search.prompt 'plain')."""
    return all(first_turn_messages(task, prompt) == plain_messages(task) for task in tasks)


def request_seed(seed: int, task_id: str, *parts: object) -> int:
    """A sampling request's own seed: a hash of the search seed, the task and where in the
    tree it asks (so it is the same however requests are scheduled or batched)."""
    import hashlib

    key = ":".join(str(part) for part in (seed, task_id, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def best_rewrite(
    rewrites: Sequence[Node], task: Task, tie_break: TieBreak = critique_tie_break
) -> Node | None:
    """The best valid, tested rewrite: highest reward-test pass fraction, then `tie_break`'s
    score (the critique by default), then shallower, then earlier (never the hidden tests);
    None when there is none."""
    candidates = [node for node in rewrites if node.valid and node.verdict is not None]
    if not candidates:
        return None
    scores = tie_break(task, candidates)
    ranked = zip(candidates, scores, strict=True)
    best, _ = max(ranked, key=lambda c: (reward_of(c[0].verdict), c[1], -c[0].depth, -c[0].id))
    return best


def final_answer(
    rewrites: Sequence[Node], root: Node, task: Task, tie_break: TieBreak = critique_tie_break
) -> Node:
    """The program a search returns from `rewrites`: `best_rewrite`; the buggy root only when
    there is none."""
    return best_rewrite(rewrites, task, tie_break) or root


def ucb1(child: Node, parent_visits: int, exploration: float) -> float:
    """Q_mcts + c * sqrt(ln N_parent / n_child); unvisited children come first."""
    if child.visits == 0:
        return math.inf
    mean = child.value_sum / child.visits
    return mean + exploration * math.sqrt(math.log(max(parent_visits, 1)) / child.visits)


@dataclass
class Tree:
    """The search over one task. Node 0 is the buggy program."""

    task: Task
    settings: SearchSettings
    index: int = 0
    nodes: list[Node] = field(default_factory=list)
    children: dict[int, list[int]] = field(default_factory=dict)
    rollouts_done: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes.append(Node(id=0, parent=None, depth=0, program=self.task.buggy_code))
            self.children[0] = []

    # ------------------------------------------------------------------ state

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def first_pass(self) -> Node | None:
        return next((n for n in self.nodes[1:] if n.verdict is not None and n.verdict.passed), None)

    @property
    def done(self) -> bool:
        if self.settings.stop_on_pass and self.first_pass() is not None:
            return True
        return self.rollouts_done >= self.settings.rollouts

    def selectable(self, node: Node) -> bool:
        """A node the search may still descend into or expand."""
        passed = node.verdict is not None and node.verdict.passed and node.id != 0
        return node.valid and node.depth < self.settings.max_depth and not passed

    # ------------------------------------------------------------------ 1. selection

    def expansions(self, node: Node) -> int:
        """How many times `node` has been expanded (its children's distinct rollouts)."""
        return len({self.nodes[i].rollout for i in self.children[node.id]})

    def wants_widening(self, node: Node) -> bool:
        """Progressive widening: a node visited N times is expanded again while it has had
        fewer than floor(N ** widening) expansions (at 0: only a node never expanded)."""
        return self.expansions(node) < math.floor(max(node.visits, 1) ** self.settings.widening)

    def select(self) -> Node:
        """Descend from the root by UCB1 through selectable children; expand a node that none
        of its children can be descended into, or that progressive widening asks to widen."""
        node = self.root
        while True:
            if self.wants_widening(node):
                return node
            options = [self.nodes[i] for i in self.children[node.id]]
            options = [child for child in options if self.selectable(child)]
            if not options:
                return node
            parent_visits = node.visits
            node = max(
                options, key=lambda c: (ucb1(c, parent_visits, self.settings.exploration), -c.id)
            )

    # ------------------------------------------------------------------ 2. expansion

    def prompt_for(self, node: Node) -> list[ChatMessage]:
        """The chat that asks for rewrites of `node`: the first turn at the root; for deeper
        nodes the parent's program and its failing *visible* tests as feedback."""
        if self.settings.mode == "plain":
            return plain_messages(self.task)
        if node.id == 0:
            return first_turn_messages(self.task, self.settings.prompt)
        outcomes = node.verdict.tests if node.verdict is not None else []
        failures = visible_failures(self.task, outcomes)
        if self.settings.refine == "one_turn":
            return one_turn_refine_messages(self.task, node.program, failures, self.settings.prompt)
        answer = node.completion or fenced(node.program)
        return refine_messages(self.task, answer, failures, self.settings.prompt)

    def expansion_request(self, node: Node) -> GenerationRequest:
        return GenerationRequest(
            messages=self.prompt_for(node),
            n=self.settings.rewrites,
            temperature=self.settings.temperature,
            top_p=self.settings.top_p,
            max_new_tokens=self.settings.max_new_tokens,
            keep_cache=self.settings.critique or self.settings.mode in ("mcts", "mt_bon"),
            seed=request_seed(
                self.settings.seed, self.task.task_id, "expand", node.id, self.rollouts_done
            ),
        )

    def add_child(
        self, parent: Node, prompt: list[ChatMessage], completion: str, program: str, valid: bool
    ) -> Node:
        child = Node(
            id=len(self.nodes),
            parent=parent.id,
            depth=parent.depth + 1,
            rollout=self.rollouts_done,
            prompt=prompt,
            completion=completion,
            program=program,
            valid=valid,
        )
        self.nodes.append(child)
        self.children[child.id] = []
        self.children[parent.id].append(child.id)
        return child

    def count_tokens(self, result: GenerationResult) -> None:
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += sum(result.completion_tokens)

    # ------------------------------------------------------------------ 3. backpropagation

    def record_own(self, node: Node, reward: float) -> None:
        """One visit worth the node's own reward, nothing backed up: how multi-turn best-of-N
        values a sample (judged on its own tests, like best-of-N's)."""
        node.visits, node.value_sum, node.q_mcts = 1, reward, reward

    def backpropagate(self, node: Node, reward: float) -> None:
        """Add one visit with `reward` to the node and every ancestor."""
        current: Node | None = node
        while current is not None:
            current.visits += 1
            current.value_sum += reward
            current.q_mcts = current.value_sum / current.visits
            current = self.nodes[current.parent] if current.parent is not None else None

    # ------------------------------------------------------------------ the answer

    def final_node(self) -> Node:
        """The program the search returns (`final_answer` over every rewrite)."""
        return final_answer(self.nodes[1:], self.root, self.task, self.settings.tie_break)

    def trajectory(self) -> Trajectory:
        first = self.first_pass()
        return Trajectory(
            task_id=self.task.task_id,
            slug=self.task.slug,
            level=self.task.level,
            category=self.task.category,
            subtype=self.task.subtype,
            mode=eval_mode_of(self.settings.mode),
            reward_tests=self.settings.reward_tests,
            nodes=self.nodes,
            solved=first is not None,
            first_pass_node=first.id if first is not None else None,
            final_node=self.final_node().id,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            seconds=round(time.perf_counter() - self.started, 3),
            model=self.settings.model,
        )
