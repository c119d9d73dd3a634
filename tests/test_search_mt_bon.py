"""Multi-turn best-of-N (search.mode mt_bon): N samples per turn, the turn's best refined with its
failing visible tests, up to T turns, a stop at a full pass; its trees make pairs of each turn's
siblings. A scripted policy and scorer (tests/test_search_mcts.py) make every number exact; the
tiny random Llama with the real sandbox runs it for real and repeats it under the same seed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from test_search_mcts import BUGGY, ScriptedPolicy, ScriptedScorer, fenced, make_task, program

from codeq import cli
from codeq.config import PairsConfig, PolicyConfig, load_config
from codeq.pairs import build_pairs
from codeq.policy import GenerationRequest
from codeq.schemas import Node, Task, Trajectory, read_jsonl
from codeq.search import SearchSettings, run_search, search


def mt_bon_config(samples: int = 3, turns: int = 4, **search_keys):
    return load_config(
        None,
        {"search": {"mode": "mt_bon", "mt_bon_samples": samples, "mt_bon_turns": turns}},
    ).derive(search=search_keys)


def rewrite_requests(policy: ScriptedPolicy) -> list[GenerationRequest]:
    return [request for call in policy.calls for request in call if request.stop == "code"]


def tagged(value: int, tag: str) -> str:
    """A rewrite that passes `value` of the scripted tests, a program of its own by `tag`."""
    return fenced(program(value) + f"TAG = {tag!r}\n")


def test_settings_resolve_n_samples_per_turn_and_t_turns():
    settings = SearchSettings.resolve(mt_bon_config(samples=5, turns=2))
    assert (settings.mode, settings.rewrites, settings.rollouts, settings.max_depth) == (
        "mt_bon",
        5,
        2,
        2,
    )
    assert settings.temperature == load_config().search.temperature
    assert settings.critique == load_config().policy.critique


def test_the_turn_best_is_refined_with_its_failing_tests_and_a_pass_stops_the_search():
    task = make_task(hidden=2)  # 3 reward tests ('all'): the visible one comes first
    policy = ScriptedPolicy(
        [fenced(program(0)), fenced(program(2)), fenced(program(1))]  # turn 1: v2 is best
        + [fenced(program(1)), fenced(program(3)), fenced(program(0))]  # turn 2: v3 passes
        + [fenced(program(3))] * 6  # never asked for
    )
    scorer = ScriptedScorer()
    [trajectory] = run_search([task], policy, None, mt_bon_config(), scorer=scorer)
    nodes = trajectory.nodes
    assert trajectory.mode == "mt_bon"
    assert [n.parent for n in nodes] == [None, 0, 0, 0, 2, 2, 2]
    assert [n.rollout for n in nodes] == [0, 1, 1, 1, 2, 2, 2]
    assert [n.depth for n in nodes] == [0, 1, 1, 1, 2, 2, 2]
    assert trajectory.solved and trajectory.first_pass_node == 5 and trajectory.final_node == 5
    requests = rewrite_requests(policy)
    assert [r.n for r in requests] == [3, 3], "a pass at turn 2 of 4 stops the search"
    # turn 2 asks to fix turn 1's best (search.refine one_turn: the program shown as the code
    # to fix) and shows the test it fails: the visible one, never a hidden one
    asked = requests[1].messages[-1].content
    assert "# v2" in asked and "# v0" not in asked and "# v1" not in asked
    assert "fails these tests" in asked and "add(1, 2)" in asked and "Expected: 3" in asked
    assert "add(0, 0)" not in asked and "add(1, 1)" not in asked
    assert all(n.prompt == list(requests[1].messages) for n in nodes[4:])
    # every valid sample is critiqued, as best-of-N's are; each is valued by its own tests
    assert all(n.q_ai is not None for n in nodes[1:])
    assert [n.q_mcts for n in nodes[1:]] == pytest.approx([0, 2 / 3, 1 / 3, 1 / 3, 1, 0])


def test_the_multi_turn_prompt_keeps_the_model_s_own_answer():
    task = make_task(hidden=2)
    policy = ScriptedPolicy([fenced(program(1)), fenced(program(0))] * 2)
    config = mt_bon_config(samples=2, turns=2, refine="multi_turn")
    run_search([task], policy, None, config, scorer=ScriptedScorer())
    second = rewrite_requests(policy)[1].messages
    assert [m.role for m in second] == ["user", "assistant", "user"]
    assert second[1].content == fenced(program(1))
    assert "add(1, 2)" in second[2].content


def test_a_search_that_never_passes_writes_n_times_t_programs():
    task = make_task(hidden=2)
    never = [tagged(1, f"n{i}") for i in range(2)] + [tagged(2, "a"), tagged(0, "b")]
    never += [tagged(1, "c"), tagged(2, "d")]
    policy = ScriptedPolicy(never + [fenced(program(3))] * 4)
    [trajectory] = run_search(
        [task], policy, None, mt_bon_config(samples=2, turns=3), scorer=ScriptedScorer()
    )
    assert len(trajectory.nodes) - 1 == 2 * 3 and not trajectory.solved
    assert [r.n for r in rewrite_requests(policy)] == [2, 2, 2]
    # turn 1 ties (1 of 3 each, equal critiques): the earlier sample is refined; turn 2's v2
    assert [n.parent for n in trajectory.nodes] == [None, 0, 0, 1, 1, 3, 3]
    assert trajectory.final_node == 3, "the best of every turn is the answer"


def test_a_turn_without_a_valid_rewrite_asks_again_from_the_same_program():
    task = make_task(hidden=2)
    invalid = [fenced(BUGGY), "I cannot help"]  # unchanged and empty: never tested
    policy = ScriptedPolicy(invalid + [tagged(1, "a"), tagged(2, "b")] + invalid)
    [trajectory] = run_search(
        [task], policy, None, mt_bon_config(samples=2, turns=3), scorer=ScriptedScorer()
    )
    assert [n.parent for n in trajectory.nodes] == [None, 0, 0, 0, 0, 4, 4]
    assert [n.valid for n in trajectory.nodes[1:]] == [False, False, True, True, False, False]
    seeds = [r.seed for r in rewrite_requests(policy)]
    assert len(set(seeds)) == 3, "asked again from the root, the turn has its own seed"


def test_the_tie_break_chooses_which_tied_sample_is_refined_and_answered():
    """The one seam a learned verifier plugs into: scores of a turn's tested samples."""
    task = make_task(hidden=2)
    rewrites = [tagged(1, "first"), tagged(1, "second"), tagged(1, "third"), tagged(1, "fourth")]
    config = mt_bon_config(samples=2, turns=2)
    seen: list[list[int]] = []

    def prefers_second(task: Task, nodes: Sequence[Node]) -> list[float]:
        seen.append([node.id for node in nodes])
        return [1.0 if "second" in node.program else 0.0 for node in nodes]

    critique = ScriptedPolicy(list(rewrites))
    [by_critique] = run_search([task], critique, None, config, scorer=ScriptedScorer())
    verifier = ScriptedPolicy(list(rewrites))
    [by_verifier] = run_search(
        [task], verifier, None, config, scorer=ScriptedScorer(), tie_break=prefers_second
    )
    assert "first" in rewrite_requests(critique)[1].messages[-1].content
    assert "second" in rewrite_requests(verifier)[1].messages[-1].content
    assert [n.parent for n in by_verifier.nodes] == [None, 0, 0, 2, 2]
    assert by_critique.final_node == 1 and by_verifier.final_node == 2
    assert seen[0] == [1, 2], "a turn's tested samples are scored together"


def test_pairs_come_from_the_siblings_of_each_turn():
    task = make_task(hidden=2)
    policy = ScriptedPolicy(
        [tagged(0, "a"), tagged(2, "b"), tagged(1, "c")]  # turn 1: b is refined
        + [tagged(1, "d"), tagged(0, "e"), tagged(2, "f")]  # turn 2: no pass
    )
    [trajectory] = run_search(
        [task], policy, None, mt_bon_config(samples=3, turns=2), scorer=ScriptedScorer()
    )
    pairs, stats = build_pairs([trajectory], PairsConfig(alpha=1.0, min_value_gap=0.1))
    turn_prompts = [list(r.messages) for r in rewrite_requests(policy)]
    by_completion = {node.completion: node for node in trajectory.nodes[1:]}
    assert len(pairs) == 6 and stats["dropped"]["small_gap"] == 0
    for pair in pairs:
        chosen, rejected = by_completion[pair.chosen], by_completion[pair.rejected]
        assert chosen.parent == rejected.parent and chosen.rollout == rejected.rollout
        assert pair.prompt in turn_prompts and pair.prompt == chosen.prompt
    # turn 1's best keeps its own value (2 of 3 tests) though its refinements did worse
    best = max(pairs, key=lambda pair: (pair.q_chosen - pair.q_rejected, "'b'" in pair.chosen))
    assert "TAG = 'b'" in best.chosen and best.q_chosen == pytest.approx(2 / 3)


def test_many_trees_share_each_turn_s_generate_call():
    tasks = [make_task(f"t{i}", hidden=0) for i in range(3)]  # one reward test
    policy = ScriptedPolicy([tagged(0, f"x{i}") for i in range(3 * 2 * 2)])
    settings = SearchSettings.resolve(mt_bon_config(samples=2, turns=2))
    trajectories = search(tasks, policy, ScriptedScorer(), settings)
    assert [t.task_id for t in trajectories] == [t.task_id for t in tasks]
    rewrite_calls = [c for c in policy.calls if c[0].stop == "code"]
    assert [[r.n for r in call] for call in rewrite_calls] == [[2, 2, 2], [2, 2, 2]]


# ------------------------------------------------------------------ the real engine


@pytest.fixture(scope="module")
def real_tasks(tmp_path_factory) -> list[Task]:
    out = tmp_path_factory.mktemp("tasks")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(out)]) == 0
    return read_jsonl(Path(out) / "train.jsonl", Task)[:2]


def test_the_tiny_model_repeats_a_seeded_multi_turn_search_and_its_first_turn_is_bon(
    tiny_model_dir, real_tasks
):
    """The real engine and the real sandbox: the same seed gives the same trees; each turn
    is one request of N samples; the first turn asks exactly what best-of-N asks, so its
    samples are best-of-N's first N (each sample has its own seeded stream)."""
    from codeq.policy import PolicyEngine
    from codeq.sandbox import Sandbox

    engine = PolicyEngine.load(
        PolicyConfig(model=str(tiny_model_dir), dtype="float32", batch_size=4), seed=0
    )
    overrides = {
        "policy": {"max_new_tokens": 16, "critique_max_new_tokens": 8},
        "search": {"temperature": 1.0, "parallel_trees": 2, "bon_samples": 3},
        "sandbox": {"workers": 2},
    }
    config = load_config(None, overrides).derive(
        search={"mode": "mt_bon", "mt_bon_samples": 3, "mt_bon_turns": 2}
    )
    with Sandbox(config.sandbox) as sandbox:
        first = run_search(real_tasks, engine, sandbox, config)
        again = run_search(real_tasks, engine, sandbox, config)
        bon = run_search(real_tasks, engine, sandbox, config.derive(search={"mode": "bon"}))

    def completions(trees: list[Trajectory]) -> list[list[str]]:
        return [[n.completion for n in t.nodes] for t in trees]

    assert completions(first) == completions(again)
    assert [t.final_node for t in first] == [t.final_node for t in again]
    for tree, sampled in zip(first, bon, strict=True):
        assert tree.mode == "mt_bon" and len(tree.nodes) - 1 <= 3 * 2
        turn_one = [n.completion for n in tree.nodes if n.rollout == 1]
        assert turn_one == [n.completion for n in sampled.nodes[1:4]]
