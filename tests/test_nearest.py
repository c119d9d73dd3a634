"""The smallest repair first as the final answer's tie-break: among rewrites tied on the visible
tests, the one nearest the buggy program (`return a - b`), the scorer only between rewrites
equally near, the visible tests always before either."""

from __future__ import annotations

from test_agreement import add_task, program, rewrites, sandbox  # noqa: F401 (a fixture)

from codeq.schemas import Node
from codeq.search.agreement import AgreementTieBreak
from codeq.search.nearest import NearestTieBreak, change_from
from codeq.search.tree import final_answer


def prefers(fragment: str):
    """A scorer that likes the rewrites holding `fragment` (as a verifier or critique may)."""

    def score(task, nodes) -> list[float]:
        return [1.0 if fragment in node.program else 0.0 for node in nodes]

    return score


def test_change_from_counts_what_a_rewrite_changed() -> None:
    buggy = program("a - b")
    assert change_from(buggy, buggy) == 0.0
    assert 0 < change_from(buggy, program("a + b")) < change_from(buggy, program("b + a"))
    assert change_from(buggy, "") == 1.0


def test_the_rewrite_nearest_the_buggy_program_is_the_answer(sandbox) -> None:  # noqa: F811
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    nodes = rewrites(task, ["3", "b + a", "a + b"], sandbox)
    assert all(node.verdict.passed for node in nodes)  # add(1, 2) = 3 for each
    assert "return 3" in final_answer(nodes, root, task, prefers("return 3")).program
    nearest = NearestTieBreak(prefers("return 3"))
    assert final_answer(nodes, root, task, nearest).program == program("a + b")


def test_the_scorer_orders_rewrites_equally_near(sandbox) -> None:  # noqa: F811
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    nodes = rewrites(task, ["a + b", "a ^ b"], sandbox)  # one character each; 1 ^ 2 = 3
    assert all(node.verdict.passed for node in nodes)
    for liked in ("a + b", "a ^ b"):
        chosen = final_answer(nodes, root, task, NearestTieBreak(prefers(liked)))
        assert chosen.program == program(liked)


def test_the_visible_tests_come_before_nearness(sandbox) -> None:  # noqa: F811
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    nodes = rewrites(task, ["a * b", "b + a"], sandbox)  # a * b: nearer, fails add(1, 2)
    assert [node.verdict.passed for node in nodes] == [False, True]
    assert final_answer(nodes, root, task, NearestTieBreak()).program == program("b + a")


def test_agreement_decides_and_nearness_orders_inside_its_group(sandbox) -> None:  # noqa: F811
    """The sums answer every probe alike (a group of two) and a ^ b alone: agreement answers a
    sum, and of the two sums the nearer, though the scorer likes the other."""
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    nodes = rewrites(task, ["a ^ b", "b + a", "a + b"], sandbox)
    tie_break = AgreementTieBreak(sandbox, 6, 0, NearestTieBreak(prefers("b + a")))
    assert final_answer(nodes, root, task, tie_break).program == program("a + b")
    scorer_only = AgreementTieBreak(sandbox, 6, 0, prefers("b + a"))
    assert final_answer(nodes, root, task, scorer_only).program == program("b + a")
    assert tie_break.__qualname__ != scorer_only.__qualname__  # resume keys tell them apart


def test_the_collect_tree_count_reads_ties_on_the_visible_tests_only(tmp_path, sandbox) -> None:  # noqa: F811
    """bench/nearest_on_collect.py on a one-round store: the constant and a + b both pass the
    visible test; only a + b (the nearer) passes the hidden one. A tree whose ties all pass is
    not counted."""
    from test_bench import load_bench

    from codeq.schemas import Trajectory, write_jsonl
    from codeq.tasks import score_programs

    bench = load_bench("nearest_on_collect")
    task = add_task()
    folder = tmp_path / "store" / "runs" / "curve" / "round-0"
    write_jsonl(folder / "tasks" / "train.jsonl", [task])

    def tree(expressions: list[str], critique: list[float]) -> Trajectory:
        programs = [program(e) for e in expressions]
        verdicts = score_programs([(task, p) for p in programs], "all", sandbox)
        nodes = [Node(id=0, parent=None, depth=0, program=task.buggy_code)] + [
            Node(id=i + 1, parent=0, depth=1, program=p, verdict=v, q_ai=q)
            for i, (p, v, q) in enumerate(zip(programs, verdicts, critique, strict=True))
        ]
        fields = task.model_dump(include={"task_id", "slug", "level", "category", "subtype"})
        return Trajectory(
            **fields, mode="mcts", reward_tests="all", nodes=nodes, solved=True, final_node=1
        )

    trees = [tree(["3", "a + b"], [0.9, 0.1]), tree(["a + b", "b + a"], [0.5, 0.5])]
    write_jsonl(folder / "trajectories" / "shard-0" / "trajectories.jsonl", trees)
    counted = bench.measure(tmp_path / "store", "curve", [0])
    assert counted["trees"] == 2
    assert counted["passes_all_tests"] == {
        "mixed ties": 1,
        "random": 0.5,
        "critique": 0.0,
        "farthest": 0.0,
        "nearest by characters": 1.0,
        "nearest by lines": 0.5,  # each changes the one return line: equally near
        "nearest by tokens": 1.0,
    }
