"""Statement examples and constraints are parsed into values the harness can call with."""

from __future__ import annotations

import random

import pytest

from codeq.tasks.literals import (
    DesignExample,
    FunctionExample,
    LiteralParseError,
    parse_example,
    parse_literal,
)
from codeq.tasks.synth import Mutator, decode_number, parse_bounds


def test_assignments_with_commas_quotes_and_leetcode_words() -> None:
    example = parse_example(
        'Input: s = "a, b = c", k = 2, root = [1,null,true,false]\n'
        "Output: [\n  [1,2],\n  [3]\n]\nExplanation: the output spans lines.\nMore text = 3"
    )
    assert isinstance(example, FunctionExample)
    assert example.names == ["s", "k", "root"]
    assert example.values == ["a, b = c", 2, [1, None, True, False]]
    assert example.output == [[1, 2], [3]]


def test_string_output_and_floats() -> None:
    example = parse_example('Input: n = 3, word = "it\'s"\nOutput: "0.5"')
    assert isinstance(example, FunctionExample)
    assert example.values == [3, "it's"]
    assert example.output == "0.5"
    assert parse_literal("2.50000") == 2.5


def test_design_example_without_colons() -> None:
    example = parse_example(
        'Input\n["MyHashMap", "put", "get"]\n[[], [1, 1], [1]]\nOutput\n[null, null, 1]\n\n'
        "Explanation\nMyHashMap myHashMap = new MyHashMap();"
    )
    assert isinstance(example, DesignExample)
    assert example.ops == ["MyHashMap", "put", "get"]
    assert example.args == [[], [1, 1], [1]]
    assert example.output == [None, None, 1]


@pytest.mark.parametrize(
    "text",
    [
        "Input: nums = [1,2]",  # no output
        "Input: nums = [1,2\nOutput: 3",  # unclosed list
        "Input: 5, 6\nOutput: 3",  # no names
        'Input\n["A", "f"]\n[[]]\nOutput\n[null]',  # design lists of different lengths
    ],
)
def test_malformed_examples_are_rejected(text: str) -> None:
    with pytest.raises(LiteralParseError):
        parse_example(text)


def test_flattened_superscripts_in_constraints_are_decoded() -> None:
    assert decode_number("104") == 10**4
    assert decode_number("2 * 105") == 2 * 10**5
    assert decode_number("231 - 1") == 2**31 - 1
    assert decode_number("-109") == -(10**9)
    assert decode_number("100") == 100
    bounds = parse_bounds("1 <= nums.length <= 105\n-104 <= nums[i] <= 104\n1 <= n, m <= 50")
    assert bounds.length["nums"] == (1, 10**5)
    assert bounds.value["nums"] == (-(10**4), 10**4)
    assert bounds.value["m"] == (1, 50)


def _mutator(examples: list[str], constraints: str, seed: int = 0) -> Mutator:
    return Mutator([parse_example(text) for text in examples], constraints, random.Random(seed))


def test_mutations_keep_relations_shown_by_every_example() -> None:
    mutator = _mutator(
        [
            "Input: nums1 = [1,3,5], nums2 = [2,2,9], n = 3\nOutput: 1",
            "Input: nums1 = [4,7], nums2 = [1,8], n = 2\nOutput: 2",
        ],
        "1 <= nums1[i], nums2[i] <= 10",
    )
    candidates = mutator.candidates(12, 80)
    assert len(candidates) >= 8
    for candidate in candidates:
        assert isinstance(candidate, FunctionExample)
        nums1, nums2, n = candidate.values
        assert len(nums1) == len(nums2) == n  # equal lengths and the tied length argument
        assert nums1 == sorted(nums1)  # every example's nums1 is sorted
        assert all(1 <= v <= 10 for v in nums1 + nums2)  # stated bounds


def test_mutations_are_deterministic_and_keep_node_ids_in_range() -> None:
    examples = ["Input: n = 4, edges = [[0,1],[1,2],[2,3]]\nOutput: 3"]
    first = _mutator(examples, "", seed=7).candidates(10, 60)
    second = _mutator(examples, "", seed=7).candidates(10, 60)
    assert [c.values for c in first] == [c.values for c in second]  # type: ignore[union-attr]
    for candidate in first:
        n, edges = candidate.values  # type: ignore[union-attr]
        assert all(0 <= node < n for edge in edges for node in edge)


def test_tree_mutations_keep_shape_and_order() -> None:
    mutator = _mutator(["Input: root = [5,3,8,null,4]\nOutput: 4"], "")
    for candidate in mutator.candidates(5, 40):
        values = candidate.values[0]  # type: ignore[union-attr]
        assert [v is None for v in values] == [False, False, False, True, False]
        assert values[1] < values[4] < values[0] < values[2]  # a BST stays a BST
