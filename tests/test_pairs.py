from __future__ import annotations

import json

import pytest

from codeq.config import PairsConfig, load_config
from codeq.errors import BadInputError
from codeq.pairs import blended_value, build_pairs, critique_signal, make_pairs
from codeq.schemas import (
    ChatMessage,
    Node,
    Pair,
    Task,
    Trajectory,
    Verdict,
    read_jsonl,
    write_jsonl,
)

PROMPT_A = [ChatMessage(role="user", content="fix program A")]
PROMPT_B = [ChatMessage(role="user", content="fix program B")]


def node(
    node_id: int,
    parent: int | None,
    completion: str,
    q_mcts: float,
    q_ai: float | None = None,
    prompt: list[ChatMessage] | None = None,
    valid: bool = True,
) -> Node:
    return Node(
        id=node_id,
        parent=parent,
        depth=0 if parent is None else 1,
        prompt=[] if parent is None else list(prompt or PROMPT_A),
        completion=completion,
        program=completion,
        q_mcts=q_mcts,
        q_ai=q_ai,
        valid=valid,
    )


def trajectory(nodes: list[Node], task_id: str = "t1", level: str = "easy") -> Trajectory:
    return Trajectory(
        task_id=task_id,
        slug=f"slug-{task_id}",
        level=level,  # type: ignore[arg-type]
        category="logic",
        subtype="condition error",
        mode="mcts",
        reward_tests="all",
        nodes=nodes,
        solved=False,
        final_node=0,
    )


def config(**changes: float) -> PairsConfig:
    return PairsConfig(**{"alpha": 1.0, "min_value_gap": 0.1, "max_pairs_per_task": 8, **changes})


def test_blended_value_mixes_search_and_critique() -> None:
    assert blended_value(node(1, 0, "x", q_mcts=1.0, q_ai=0.0), 0.25) == pytest.approx(0.25)
    assert blended_value(node(1, 0, "x", q_mcts=0.6, q_ai=None), 0.25) == pytest.approx(0.6)


def test_siblings_with_a_clear_gap_become_a_pair_with_their_shared_prompt() -> None:
    tree = trajectory(
        [
            node(0, None, "", 0.0),
            node(1, 0, "good program", 1.0),
            node(2, 0, "bad program", 0.2),
            node(3, 0, "almost good", 0.95),
        ]
    )
    pairs, stats = build_pairs([tree], config())
    got = {(p.chosen, p.rejected) for p in pairs}
    assert got == {("good program", "bad program"), ("almost good", "bad program")}
    assert all(p.prompt == PROMPT_A for p in pairs)
    assert stats["dropped"]["small_gap"] == 1  # good vs almost good: |dQ| = 0.05 <= 0.1
    assert stats["pairs"] == 2 and stats["by_level"] == {"easy": 2}
    assert stats["by_category"] == {"logic": 2}


def test_only_siblings_pair_not_cousins_and_prompts_stay_separate() -> None:
    tree = trajectory(
        [
            node(0, None, "", 0.0),
            node(1, 0, "root child", 1.0),
            node(2, 1, "grandchild", 0.0, prompt=PROMPT_B),
            node(3, 1, "grandchild two", 0.5, prompt=PROMPT_B),
        ]
    )
    pairs, _ = build_pairs([tree], config())
    assert [(p.chosen, p.rejected, p.prompt) for p in pairs] == [
        ("grandchild two", "grandchild", PROMPT_B)
    ]


def test_critique_changes_which_side_is_chosen() -> None:
    tree = trajectory(
        [
            node(0, None, "", 0.0),
            node(1, 0, "tests like it", 0.6, q_ai=0.0),
            node(2, 0, "critic likes it", 0.4, q_ai=1.0),
        ]
    )
    search_only, _ = build_pairs([tree], config(alpha=1.0))
    mostly_critic, _ = build_pairs([tree], config(alpha=0.2))
    assert search_only[0].chosen == "tests like it"
    assert mostly_critic[0].chosen == "critic likes it"
    assert mostly_critic[0].q_chosen == pytest.approx(0.2 * 0.4 + 0.8 * 1.0)


def test_degenerate_duplicate_and_invalid_pairs_are_dropped_and_counted() -> None:
    tree = trajectory(
        [
            node(0, None, "", 0.0),
            node(1, 0, "def f():\n    return 1", 1.0),
            node(2, 0, "def f():  \n\treturn   1  # one\n", 0.0),  # the same syntax tree
            node(3, 0, "", 0.0, valid=False),
            node(4, 0, "garbage", 0.9, valid=False),
        ]
    )
    # raw completions that differ only in prose around the same program are degenerate too
    tree.nodes[2].completion = "Fixed it:\n```python\n" + tree.nodes[2].program + "```"
    pairs, stats = build_pairs([tree], config())
    assert all(p.chosen.strip() != "" for p in pairs)
    assert stats["dropped"]["degenerate"] == 1
    assert stats["dropped"]["both_invalid"] == 1  # node 4 vs node 3
    assert stats["dropped"]["chosen_invalid"] == 1  # invalid node 4 over valid node 2
    assert [(p.chosen, p.rejected) for p in pairs] == [("def f():\n    return 1", "")]
    assert stats["dropped"]["unseen_prompt"] == 0
    # the same tree again (e.g. a re-collected shard) adds only duplicates
    again, stats_again = build_pairs([tree, tree], config())
    assert len(again) == len(pairs)
    assert stats_again["dropped"]["duplicate"] == len(pairs)


def test_cap_per_task_keeps_the_largest_value_gaps() -> None:
    nodes = [node(0, None, "", 0.0)] + [
        node(i, 0, f"program {i}", q_mcts=i / 10) for i in range(1, 11)
    ]
    pairs, stats = build_pairs([trajectory(nodes)], config(max_pairs_per_task=3))
    assert len(pairs) == 3
    gaps = sorted((p.q_chosen - p.q_rejected for p in pairs), reverse=True)
    assert gaps[0] == pytest.approx(0.9)
    assert min(gaps) >= 0.8 - 1e-9
    assert stats["dropped"]["per_task_cap"] > 0


def test_make_pairs_reads_shard_folders_and_writes_pairs_and_stats(tmp_path) -> None:
    tree_one = trajectory([node(0, None, "", 0), node(1, 0, "a", 1.0), node(2, 0, "b", 0.0)])
    tree_two = trajectory(
        [node(0, None, "", 0), node(1, 0, "c", 1.0), node(2, 0, "d", 0.0)],
        task_id="t2",
        level="hard",
    )
    write_jsonl(tmp_path / "traj" / "shard-0" / "trajectories.jsonl", [tree_one])
    write_jsonl(tmp_path / "traj" / "shard-1" / "trajectories.jsonl", [tree_two])
    stats = make_pairs([tmp_path / "traj"], tmp_path / "out", load_config())
    pairs = read_jsonl(tmp_path / "out" / "pairs.jsonl", Pair)
    assert len(pairs) == stats["pairs"] == 2
    saved = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert saved["by_level"] == {"easy": 1, "hard": 1}
    with pytest.raises(BadInputError):
        make_pairs([tmp_path / "empty"], tmp_path / "out2", load_config())


@pytest.mark.parametrize("refine", ["multi_turn", "one_turn"])
def test_siblings_refining_a_program_that_passes_the_examples_are_left_out(refine) -> None:
    from codeq.policy.prompts import feedback_text, one_turn_refine_messages

    if refine == "multi_turn":
        asked_past_examples = [*PROMPT_A, ChatMessage(role="user", content=feedback_text([]))]
    else:
        task = Task(
            task_id="t1",
            slug="add",
            level="easy",
            category="logic",
            subtype="operation error",
            description="Return a + b.",
            buggy_code="def add(a, b):\n    return a - b\n",
            oracle_code="def add(a, b):\n    return a + b\n",
            entry={"kind": "function", "method": "add"},
            examples=[],
            visible_tests=[],
            hidden_tests=[],
        )
        asked_past_examples = one_turn_refine_messages(task, "passes the examples", [])
    tree = trajectory(
        [
            node(0, None, "", 0.0),
            node(1, 0, "passes the examples", 0.5),
            node(2, 1, "fixed for good", 1.0, prompt=asked_past_examples),
            node(3, 1, "broke it", 0.0, prompt=asked_past_examples),
            node(4, 1, "also broke it", 0.0, prompt=asked_past_examples),
        ]
    )
    pairs, stats = build_pairs([tree], config())
    assert pairs == []
    assert stats["dropped"]["unseen_prompt"] == 3


def test_pairs_record_the_policy_and_refuse_trajectories_of_two_policies(tmp_path) -> None:
    from codeq.errors import CorruptInputError
    from codeq.schemas import AdapterLink, Lineage

    base = Lineage(base_model="smollm2", base_sha256="a" * 64)
    later = base.extended(AdapterLink(round=0, sha256="b" * 64, source="runs/r/round-0/adapter"))
    nodes = [node(0, None, "", 0.0), node(1, 0, "good", 1.0), node(2, 0, "bad", 0.0)]
    first = trajectory(nodes, task_id="t1").model_copy(update={"policy": later})
    second = trajectory(nodes, task_id="t2").model_copy(update={"policy": later})
    write_jsonl(tmp_path / "one.jsonl", [first, second])
    stats = make_pairs([tmp_path / "one.jsonl"], tmp_path / "out", load_config())
    assert stats["policy"] == later.model_dump()
    written = read_jsonl(tmp_path / "out" / "pairs.jsonl", Pair)
    assert written and all(pair.policy == later for pair in written)
    mixed = second.model_copy(update={"policy": base})
    write_jsonl(tmp_path / "two.jsonl", [first, mixed])
    with pytest.raises(CorruptInputError, match="2 different policies"):
        make_pairs([tmp_path / "two.jsonl"], tmp_path / "out2", load_config())


def with_verdict(node_id: int, passed: bool, q_ai: float | None) -> Node:
    verdict = Verdict(
        passed=passed,
        n_passed=int(passed),
        n_total=1,
        status="passed" if passed else "failed",
        backend="subprocess",
    )
    return node(node_id, 0, f"p{node_id}", q_mcts=float(passed), q_ai=q_ai).model_copy(
        update={"verdict": verdict}
    )


def test_critique_signal_ranks_passing_against_failing_rewrites() -> None:
    root = node(0, None, "buggy", 0.0)
    agreeing = trajectory(
        [root, with_verdict(1, True, 0.9), with_verdict(2, False, 0.2), with_verdict(3, False, 0.9)]
    )
    signal = critique_signal([agreeing])
    assert (signal.passing, signal.failing) == (1, 2)
    assert signal.auc == pytest.approx(0.75)  # beats 0.2, ties 0.9
    assert signal.carries_signal is True

    inverted = trajectory(
        [root, with_verdict(1, True, 0.1), with_verdict(2, False, 0.8), with_verdict(3, True, None)]
    )
    assert critique_signal([inverted]).auc == pytest.approx(0.0)
    assert critique_signal([inverted]).carries_signal is False
    unknown = critique_signal([trajectory([root, with_verdict(1, False, 0.5)])])
    assert unknown.auc is None and unknown.carries_signal is None


def test_pairs_stats_record_the_critique_auc(tmp_path, caplog) -> None:
    root = node(0, None, "buggy", 0.0)
    path = tmp_path / "t.jsonl"
    write_jsonl(path, [trajectory([root, with_verdict(1, True, 0.2), with_verdict(2, False, 0.7)])])
    stats = make_pairs([path], tmp_path / "out", load_config(None, {"pairs": {"alpha": 0.5}}))
    assert stats["critique_auc"] == pytest.approx(0.0)
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["critique_auc"] == 0.0
    assert "consider pairs.alpha=1.0" in caplog.text  # blending a critique without signal
