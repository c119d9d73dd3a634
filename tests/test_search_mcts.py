"""MCTS arithmetic, selection, batching and the final answer, with a scripted stand-in policy and
a scripted scorer (no model, no sandbox): every number here is computed by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from codeq.config import load_config
from codeq.errors import ConfigError
from codeq.policy import GenerationRequest, GenerationResult
from codeq.schemas import Task, TestSplit, Verdict
from codeq.schemas import TestCase as Case
from codeq.schemas import TestOutcome as Outcome
from codeq.search import SearchSettings, Tree, run_search, search, ucb1

BUGGY = "class Solution:\n    def add(self, a, b):\n        return a - b\n"


def make_task(task_id: str = "t0", hidden: int = 2) -> Task:
    call = {"kind": "function", "method": "add", "args": [1, 2]}
    return Task(
        task_id=task_id,
        slug=f"add-{task_id}",
        level="easy",
        category="logic",
        subtype="operation error",
        description="Return a + b.",
        examples=["Input: a = 1, b = 2\nOutput: 3"],
        buggy_code=BUGGY,
        oracle_code=BUGGY.replace("-", "+"),
        entry={"kind": "function", "method": "add"},
        visible_tests=[Case(call=call, expected=3)],
        hidden_tests=[
            Case(call={**call, "args": [i, i]}, expected=2 * i, origin="generated")
            for i in range(hidden)
        ],
    )


def program(value: int) -> str:
    """A distinct program whose scripted pass count is `value`."""
    return f"class Solution:\n    def add(self, a, b):\n        return a + b  # v{value}\n"


def fenced(code: str) -> str:
    return f"Here is the fix:\n```python\n{code}```"


class ScriptedPolicy:
    """Answers rewrite requests from a queue of texts and critiques with a fixed score; records
    every call so batching can be checked."""

    name = "scripted"

    def __init__(self, rewrites: list[str], critique: str = "6/10") -> None:
        self.rewrites = list(rewrites)
        self.critique_text = critique
        self.calls: list[list[GenerationRequest]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.calls.append(list(requests))
        results = []
        for request in requests:
            if request.stop == "score":  # critique
                results.append(GenerationResult([self.critique_text], 10, [5]))
                continue
            texts = [self.rewrites.pop(0) if self.rewrites else "" for _ in range(request.n)]
            results.append(GenerationResult(texts, 20, [7] * request.n))
        return results


class ScriptedScorer:
    """Pass count per program from the `# vN` marker: the *last* N tests pass (so a partial pass
    fails the visible test, which comes first); the buggy code passes none."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, TestSplit]] = []

    def __call__(self, items: Sequence[tuple[Task, str]], which: TestSplit) -> list[Verdict]:
        self.calls.append((len(items), which))
        verdicts = []
        for task, code in items:
            total = len(task.tests(which))
            passed = min(total, int(code.split("# v")[1].split()[0])) if "# v" in code else 0
            outcomes = [
                Outcome(
                    passed=ok,
                    status="ok" if ok else "wrong_answer",
                    detail=None if ok else "got -1",
                )
                for ok in [i >= total - passed for i in range(total)]
            ]
            verdicts.append(
                Verdict(
                    passed=passed == total,
                    n_passed=passed,
                    n_total=total,
                    status="passed" if passed == total else "failed",
                    backend="scripted",
                    tests=outcomes,
                )
            )
        return verdicts


def settings(**changes) -> SearchSettings:
    overrides = {"search": {"rewrites_per_expansion": 2, "rollouts": 3, "max_depth": 3}}
    config = load_config(None, overrides).derive(search={"mode": changes.pop("mode", "mcts")})
    base = SearchSettings.resolve(config)
    return SearchSettings(**{**base.__dict__, **changes})


def test_ucb1_prefers_unvisited_then_balances_value_and_exploration():
    task = make_task()
    tree = Tree(task=task, settings=settings())
    child = tree.add_child(tree.root, [], "", program(1), True)
    assert ucb1(child, 1, 1.0) == math.inf
    child.visits, child.value_sum = 2, 1.0
    assert ucb1(child, 8, 1.4) == pytest.approx(0.5 + 1.4 * math.sqrt(math.log(8) / 2))


def test_backpropagation_updates_every_ancestor_with_the_pass_fraction():
    tree = Tree(task=make_task(), settings=settings())
    tree.backpropagate(tree.root, 0.0)
    a = tree.add_child(tree.root, [], "", program(1), True)
    b = tree.add_child(a, [], "", program(2), True)
    tree.backpropagate(a, 1 / 3)
    tree.backpropagate(b, 2 / 3)
    assert (tree.root.visits, b.visits, a.visits) == (3, 1, 2)
    assert a.q_mcts == pytest.approx(0.5)
    assert tree.root.q_mcts == pytest.approx(1 / 3)


def test_selection_descends_by_ucb_and_skips_invalid_and_depth_limited_nodes():
    # without progressive widening (the test below covers it), the root is expanded once
    tree = Tree(task=make_task(), settings=settings(max_depth=2, exploration=0.0, widening=0.0))
    tree.backpropagate(tree.root, 0.0)
    good = tree.add_child(tree.root, [], "", program(2), True)
    bad = tree.add_child(tree.root, [], "", "", False)
    tree.backpropagate(good, 2 / 3)
    tree.backpropagate(bad, 0.0)
    assert tree.select() is good
    deep = tree.add_child(good, [], "", program(1), True)
    tree.backpropagate(deep, 1 / 3)
    # `deep` sits at max_depth: it cannot be expanded, so `good` is widened instead.
    assert tree.select() is good


def test_mcts_expands_tests_critiques_and_stops_at_a_full_pass():
    task = make_task(hidden=2)  # 3 reward tests with reward_tests="all"
    policy = ScriptedPolicy(
        [fenced(program(1)), fenced(program(2)), fenced(program(3)), fenced(program(1))]
    )
    scorer = ScriptedScorer()
    [trajectory] = search([task], policy, scorer, settings(exploration=0.0, refine="multi_turn"))
    nodes = trajectory.nodes
    # rollout 1 expands the root into v1, v2; rollout 2 expands v2 (the best) into v3 (pass).
    assert [n.parent for n in nodes] == [None, 0, 0, 2, 2]
    assert [n.rollout for n in nodes] == [0, 1, 1, 2, 2]
    assert trajectory.solved and trajectory.first_pass_node == 3
    assert trajectory.final_node == 3
    assert nodes[2].visits == 3 and nodes[2].q_mcts == pytest.approx((2 / 3 + 1 + 1 / 3) / 3)
    assert nodes[0].visits == 5 and nodes[0].value_sum == pytest.approx(1 / 3 + 2 / 3 + 1 + 1 / 3)
    assert all(n.q_ai == pytest.approx(0.6) for n in nodes[1:])
    assert all(which == "all" for _, which in scorer.calls)
    # the deeper prompt shows the parent program and its failing *visible* test only
    deeper = nodes[3].prompt
    assert deeper[-2].role == "assistant" and "# v2" in deeper[-2].content
    assert "add(1, 2)" in deeper[-1].content and "Expected: 3" in deeper[-1].content
    assert "add(0, 0)" not in deeper[-1].content and "add(1, 1)" not in deeper[-1].content
    assert trajectory.completion_tokens == 2 * 14 + 4 * 5
    assert trajectory.prompt_tokens == 2 * 20 + 4 * 10


def distinct_failing_rewrites(count: int) -> list[str]:
    """Rewrites that all pass 1 of 3 reward tests, each a different program."""
    return [fenced(program(1).replace("# v1", f"# v1 n{i}")) for i in range(count)]


@pytest.mark.parametrize(
    ("widening", "parents"),
    [
        # expanded once, the root is only descended from: every later rollout refines node 1
        (0.0, [None, 0, 0, 1, 1, 1, 1, 1, 1]),
        # root visits 1, 3, 5, 7 allow floor(sqrt(N)) = 1, 1, 2, 2 expansions: rollouts 1 and 3
        # sample the buggy program again; node 1 (visits 1, then 3) is refined at 2 and 4
        (0.5, [None, 0, 0, 1, 1, 0, 0, 1, 1]),
        # widening 1: a node is expanded again for as many visits as it has: only the root
        (1.0, [None, 0, 0, 0, 0, 0, 0, 0, 0]),
    ],
)
def test_progressive_widening_expands_a_visited_node_again(widening, parents):
    task = make_task(hidden=2)
    policy = ScriptedPolicy(distinct_failing_rewrites(8))
    chosen = settings(rollouts=4, max_depth=2, exploration=0.0, widening=widening)
    [trajectory] = search([task], policy, ScriptedScorer(), chosen)
    assert [n.parent for n in trajectory.nodes] == parents
    assert [n.rollout for n in trajectory.nodes] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert load_config(None, {"search": {"widening": widening}}).search.widening == widening


@pytest.mark.parametrize("refine", ["multi_turn", "one_turn"])
def test_feedback_never_mentions_hidden_failures_when_visible_tests_pass(refine):
    task = make_task(hidden=2)
    tree = Tree(task=task, settings=settings(refine=refine))
    node = tree.add_child(tree.root, [], "", program(1), True)
    passes_visible_only = ScriptedScorer()([(task, program(1))], "all")[0]
    passes_visible_only.tests.reverse()  # visible ok, both hidden fail
    node.verdict = passes_visible_only
    feedback = tree.prompt_for(node)[-1].content
    assert "passes the examples" in feedback and "fails" not in feedback
    assert "Got:" not in feedback and "add(0, 0)" not in feedback and "add(1, 1)" not in feedback
    assert "got -1" not in feedback
    if refine == "multi_turn":  # the one-turn prompt shows the program, `def add(` included
        assert "add(" not in feedback


@pytest.mark.parametrize("style", ["plain", "detailed"])
def test_one_turn_refinement_shows_the_parent_program_as_the_code_to_fix(style):
    task = make_task(hidden=2)
    multi = Tree(task=task, settings=settings(prompt=style, refine="multi_turn"))
    one = Tree(task=task, settings=settings(prompt=style, refine="one_turn"))
    for tree in (multi, one):
        node = tree.add_child(tree.root, [], fenced(program(0)), program(0), True)
        node.verdict = ScriptedScorer()([(task, program(0))], "all")[0]  # fails add(1, 2)
    multi_prompt = multi.prompt_for(multi.nodes[1])
    one_prompt = one.prompt_for(one.nodes[1])
    assert [m.role for m in multi_prompt][-3:] == ["user", "assistant", "user"]
    assert "assistant" not in [m.role for m in one_prompt]
    asked = one_prompt[-1].content
    assert program(0).strip() in asked and BUGGY.strip() not in asked
    assert "fails these tests" in asked and "add(1, 2)" in asked
    # the root still asks the first turn, whichever refinement
    assert one.prompt_for(one.root) == multi.prompt_for(multi.root)


def test_invalid_rewrites_are_kept_but_untested_and_never_final():
    task = make_task()
    policy = ScriptedPolicy([fenced(BUGGY), "I cannot help", fenced(program(1)), "```python\n```"])
    scorer = ScriptedScorer()
    [trajectory] = search([task], policy, scorer, settings(rollouts=2, exploration=0.0))
    valid = [n.valid for n in trajectory.nodes[1:]]
    assert valid == [False, False, True, False]
    assert all(n.verdict is None for n in trajectory.nodes[1:] if not n.valid)
    assert trajectory.final_node == 3 and not trajectory.solved


def test_final_answer_ties_break_by_critique_then_depth():
    tree = Tree(task=make_task(), settings=settings())
    scorer = ScriptedScorer()
    a = tree.add_child(tree.root, [], "", program(1), True)
    b = tree.add_child(tree.root, [], "", program(1), True)
    for node, verdict in zip((a, b), scorer([(tree.task, a.program)] * 2, "all"), strict=True):
        node.verdict = verdict
    a.q_ai, b.q_ai = 0.2, 0.9
    assert tree.final_node() is b
    b.q_ai = 0.2
    assert tree.final_node() is a


def test_many_trees_share_each_generate_call_and_keep_task_order():
    tasks = [make_task(f"t{i}", hidden=0) for i in range(5)]  # one reward test: v1 passes
    rewrites = [fenced(program(0)) for _ in range(40)]
    policy = ScriptedPolicy(rewrites)
    trajectories = search(tasks, policy, ScriptedScorer(), settings(parallel_trees=4, rollouts=2))
    assert [t.task_id for t in trajectories] == [t.task_id for t in tasks]
    rewrite_calls = [c for c in policy.calls if c[0].stop == "code"]
    assert [len(c) for c in rewrite_calls] == [4, 4, 1, 1]  # refilled as trees finish
    assert all(len(t.nodes) == 1 + 2 * 2 for t in trajectories)


def test_bon_greedy_and_plain_modes():
    task = make_task(hidden=0)
    policy = ScriptedPolicy([fenced(program(0))] * 3 + [fenced(program(1))])
    config = load_config(None, {"search": {"bon_samples": 4}})
    [bon] = run_search(
        [task], policy, None, config.derive(search={"mode": "bon"}), scorer=ScriptedScorer()
    )
    assert bon.mode == "bon" and len(bon.nodes) == 5 and bon.final_node == 4
    policy = ScriptedPolicy([fenced(program(1))] * 2)
    greedy_config = config.derive(search={"mode": "greedy"})
    [greedy] = run_search([task], policy, None, greedy_config, scorer=ScriptedScorer())
    [request] = policy.calls[0]
    assert greedy.mode == "full_rewrite" and request.temperature == 0 and request.n == 1
    assert len(policy.calls) == 1  # no critique for single greedy rewrites
    plain_config = config.derive(search={"mode": "plain"})
    [plain] = run_search([task], policy, None, plain_config, scorer=ScriptedScorer())
    assert plain.mode == "zero_shot" and plain.nodes[1].prompt[0].role == "user"
    assert "Example" not in plain.nodes[1].prompt[0].content


def test_visible_reward_never_sends_hidden_tests_to_the_scorer():
    scorer = ScriptedScorer()
    config = load_config(None, {"search": {"rollouts": 1, "reward_tests": "visible"}})
    policy = ScriptedPolicy([fenced(program(1))] * 3)
    [trajectory] = run_search([make_task()], policy, None, config, scorer=scorer)
    assert {which for _, which in scorer.calls} == {"visible"}
    assert trajectory.reward_tests == "visible" and trajectory.solved


def test_bad_mode_and_reward_are_config_errors():
    config = load_config()
    with pytest.raises(ConfigError, match="search.mode"):
        config.derive(search={"mode": "beam"})
    with pytest.raises(ConfigError, match="search.reward_tests"):
        config.derive(search={"reward_tests": "hidden"})
    with pytest.raises(ConfigError, match="search.mode"):
        load_config(None, {"search": {"mode": "beam"}})
