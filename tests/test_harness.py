"""The LeetCode harness and score_programs, run through the real sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from codeq.config import load_config
from codeq.schemas import Task
from codeq.schemas import TestCase as Case
from codeq.tasks import outputs_match, score_programs
from codeq.tasks.harness import detect_entry, make_call
from codeq.tasks.literals import parse_example


@pytest.fixture(scope="module")
def sandbox() -> Iterator[object]:
    from codeq.sandbox import Sandbox

    with Sandbox(load_config().sandbox) as running:
        yield running


def _task(oracle: str, examples: list[tuple[str, object]], check: dict | None = None) -> Task:
    """A task whose visible tests are the given examples (input text, expected output)."""
    parsed = [parse_example(f"Input: {text}\nOutput: 0") for text, _ in examples]
    entry = detect_entry(oracle, parsed[0])
    tests = [
        Case(call=make_call(entry, example), expected=expected, check=check or {})
        for example, (_, expected) in zip(parsed, examples, strict=True)
    ]
    return Task(
        task_id="t" * 16,
        slug="harness-check",
        level="easy",
        category="logic",
        subtype="other error",
        description="",
        examples=[],
        buggy_code="",
        oracle_code=oracle,
        entry=entry,
        visible_tests=tests,
        hidden_tests=tests[-1:],
    )


TREE_ORACLE = """
class Solution:
    def invert(self, root: Optional[TreeNode]) -> Optional[TreeNode]:
        if root:
            root.left, root.right = self.invert(root.right), self.invert(root.left)
        return root
"""
LIST_ORACLE = """
class Solution:
    def middle(self, head: Optional[ListNode]) -> Optional[ListNode]:
        slow = fast = head
        while fast and fast.next:
            slow, fast = slow.next, fast.next.next
        return slow
"""


def test_trees_and_linked_lists_round_trip(sandbox) -> None:
    tree = _task(
        TREE_ORACLE, [("root = [4,2,7,1,3,null,9]", [4, 7, 2, 9, None, 3, 1]), ("root = []", [])]
    )
    linked = _task(LIST_ORACLE, [("head = [1,2,3,4,5]", [3, 4, 5]), ("head = [1]", [1])])
    verdicts = score_programs([(tree, TREE_ORACLE), (linked, LIST_ORACLE)], "visible", sandbox)
    assert [v.status for v in verdicts] == ["passed", "passed"]
    assert verdicts[0].n_total == 2 and verdicts[0].backend in {"gvisor", "subprocess"}


def test_tree_node_reference_arguments(sandbox) -> None:
    oracle = """
class Solution:
    def depthOf(self, root: TreeNode, p: TreeNode) -> int:
        depth, node = 0, root
        while node is not p:
            node = node.left if p.val < node.val else node.right
            depth += 1
        return depth
"""
    task = _task(oracle, [("root = [5,3,8,1,4], p = 4", 2), ("root = [5,3,8], p = 5", 0)])
    assert [t.call["arg_kinds"] for t in task.visible_tests][0] == ["tree", "tree_ref"]
    assert score_programs([(task, oracle)], "visible", sandbox)[0].passed


def test_in_place_problems_compare_the_mutated_argument(sandbox) -> None:
    oracle = """
class Solution:
    def rotate(self, nums: List[int], k: int) -> None:
        k %= len(nums)
        nums[:] = nums[-k:] + nums[:-k]
"""
    buggy = oracle.replace("nums[:] =", "nums =")  # rebinds instead of mutating
    task = _task(oracle, [("nums = [1,2,3,4,5], k = 2", [4, 5, 1, 2, 3])])
    assert task.entry["inplace"] is True
    good, bad = score_programs([(task, oracle), (task, buggy)], "visible", sandbox)
    assert good.passed
    assert not bad.passed and bad.status == "failed" and bad.tests[0].status == "wrong_answer"


def test_class_design_sequences(sandbox) -> None:
    oracle = """
class Counter2:
    def __init__(self, start: int):
        self.value = start
    def add(self, amount: int) -> None:
        self.value += amount
    def get(self) -> int:
        return self.value
"""
    example = parse_example(
        'Input\n["Counter2", "add", "get"]\n[[5], [2], []]\nOutput\n[null, null, 7]'
    )
    entry = detect_entry(oracle, example)
    test = Case(call=make_call(entry, example), expected=example.output)
    task = _task(TREE_ORACLE, [("root = []", [])]).model_copy(
        update={"entry": entry, "visible_tests": [test], "hidden_tests": [test]}
    )
    wrong = oracle.replace("+= amount", "-= amount")
    good, bad = score_programs([(task, oracle), (task, wrong)], "all", sandbox)
    assert good.passed and good.n_total == 2
    assert not bad.passed and bad.n_passed == 0


def test_unordered_and_float_checks() -> None:
    assert outputs_match([[2, 1], [3]], [[3], [1, 2]], {"unordered": True})
    assert not outputs_match([[2, 1], [3]], [[3], [1, 2]], {})
    assert outputs_match(0.3333333, 1 / 3, {"float_tolerance": 1e-5})
    assert not outputs_match(0.34, 1 / 3, {"float_tolerance": 1e-5})
    assert not outputs_match(True, 1, {})  # bools are not integers
    assert outputs_match(None, [], {})  # LeetCode prints a None list as []


ORACLE = """
class Solution:
    def double(self, n: int) -> int:
        return 2 * n
"""


@pytest.mark.parametrize(
    ("program", "status"),
    [
        (ORACLE, "passed"),
        (ORACLE.replace("2 * n", "n + 2"), "failed"),
        (ORACLE.replace("int:", "int"), "syntax_error"),
        (ORACLE.replace("return 2 * n", "while True:\n            pass"), "timeout"),
        (ORACLE.replace("2 * n", "undefined_name"), "failed"),
        ("raise RuntimeError('at import')\n" + ORACLE, "crash"),
    ],
)
def test_verdict_statuses(sandbox, program: str, status: str) -> None:
    task = _task(ORACLE, [("n = 2", 4), ("n = 5", 10)]).model_copy(
        update={"entry": {"call_timeout_s": 1.0}}
    )
    verdict = score_programs([(task, program)], "visible", sandbox)[0]
    assert verdict.status == status
    assert verdict.passed is (status == "passed")
    assert verdict.n_total == 2
    if status == "failed" and "undefined_name" in program:
        assert verdict.tests[0].status == "error" and "NameError" in (verdict.tests[0].detail or "")


def test_k_prefix_outputs_judge_only_the_first_k(sandbox) -> None:
    oracle = """
class Solution:
    def removeDuplicates(self, nums: List[int]) -> int:
        k = 0
        for num in nums:
            if k == 0 or nums[k - 1] != num:
                nums[k] = num
                k += 1
        return k
"""
    example = parse_example("Input: nums = [1,1,2]\nOutput: 2, nums = [1,2,_]")
    entry = detect_entry(oracle, example)
    assert entry["k_prefix"] and example.output == [2, [1, 2]]  # type: ignore[union-attr]
    test = Case(call=make_call(entry, example), expected=example.output, check={"k_prefix": True})
    task = _task(TREE_ORACLE, [("root = []", [])]).model_copy(
        update={"entry": entry, "visible_tests": [test], "hidden_tests": []}
    )
    keeps_duplicates = oracle.replace("if k == 0 or nums[k - 1] != num:", "if True:")
    good, bad = score_programs([(task, oracle), (task, keeps_duplicates)], "visible", sandbox)
    assert good.passed
    assert not bad.passed


def test_cycle_position_and_float_parameters(sandbox) -> None:
    cycle = """
class Solution:
    def hasCycle(self, head: Optional[ListNode]) -> bool:
        slow = fast = head
        while fast and fast.next:
            slow, fast = slow.next, fast.next.next
            if slow is fast:
                return True
        return False
"""
    task = _task(cycle, [("head = [3,2,0,-4], pos = 1", True), ("head = [1], pos = -1", False)])
    assert task.visible_tests[0].call["arg_kinds"] == ["linked_list_cycle"]
    halves = """
class Solution:
    def half(self, hour: float) -> bool:
        return isinstance(hour, float) and hour.is_integer()
"""
    floats = _task(halves, [("hour = 6", True), ("hour = 2.5", False)])
    verdicts = score_programs([(task, cycle), (floats, halves)], "visible", sandbox)
    assert [v.status for v in verdicts] == ["passed", "passed"]
