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
