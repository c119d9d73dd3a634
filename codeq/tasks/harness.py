"""LeetCode harness: the prelude run before every program, the trusted runner source, and the
entry point (which Solution method or design class to call, with which argument kinds)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from codeq.tasks.literals import DesignExample, FunctionExample, ParsedExample

RUNNER_SOURCE = (Path(__file__).parent / "runner.py").read_text(encoding="utf-8")

PRELUDE = """\
from typing import *
from bisect import *
from collections import *
from functools import *
from heapq import *
from itertools import *
from math import *
from operator import *
from statistics import *
import array, bisect, collections, copy, functools, heapq, itertools, math, operator, random, re
import statistics, string, sys
from builtins import abs, pow  # the star imports above shadow these with 2-argument versions
sys.setrecursionlimit(20000)


class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next


class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right


class Node:
    # LeetCode's several Node shapes (n-ary, graph, next/random pointers, quad tree), told
    # apart by how the solution constructs them.

    def __init__(self, val=0, *rest, **named):
        self.val = val
        self.left = self.right = self.next = self.random = None
        self.children = []
        self.neighbors = []
        if len(rest) == 5 or (rest and isinstance(rest[0], bool)):
            names = ("isLeaf", "topLeft", "topRight", "bottomLeft", "bottomRight")
        elif len(rest) == 1 and isinstance(rest[0], list):
            names = ("children",)
            self.neighbors = rest[0]
        else:
            names = ("left", "right", "next")
        for name, value in zip(names, rest):
            setattr(self, name, value)
        for name, value in named.items():
            setattr(self, name, value)
"""


class EntryError(ValueError):
    """The oracle has no callable entry point the harness understands."""


def _kind_of(annotation: ast.expr | None) -> str:
    if annotation is None:
        return "plain"
    text = ast.unparse(annotation)
    is_list = bool(re.search(r"\b(List|list|Sequence)\[", text))
    if re.search(r"\bTreeNode\b", text):
        return "tree_list" if is_list else "tree"
    if re.search(r"\bListNode\b", text):
        return "linked_list_list" if is_list else "linked_list"
    if re.search(r"\bNode\b", text):
        return "node"
    if text == "float":
        return "float"  # LeetCode passes `hour = 6` to a float parameter as 6.0
    return "plain"


def _public_methods(class_node: ast.ClassDef) -> list[ast.FunctionDef]:
    return [
        item
        for item in class_node.body
        if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
    ]


def _params(function: ast.FunctionDef) -> list[ast.arg]:
    params = list(function.args.posonlyargs) + list(function.args.args)
    return params[1:] if params and params[0].arg in {"self", "cls"} else params


def _classes(oracle: str) -> dict[str, ast.ClassDef]:
    try:
        tree = ast.parse(oracle)
    except SyntaxError as exc:
        raise EntryError(f"oracle does not parse: {exc.msg}") from exc
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _choose_method(solution: ast.ClassDef, names: list[str]) -> ast.FunctionDef:
    methods = _public_methods(solution)
    if not methods:
        raise EntryError("class Solution has no public method")

    def score(method: ast.FunctionDef) -> tuple[int, int]:
        params = [p.arg for p in _params(method)]
        return (len(set(params) & set(names)) - abs(len(params) - len(names)), -len(params))

    return max(methods, key=score)


def detect_entry(oracle: str, example: ParsedExample) -> dict[str, Any]:
    """How to call the oracle for this example's shape (ast of the oracle, never executed)."""
    classes = _classes(oracle)
    if isinstance(example, DesignExample):
        name = example.ops[0]
        if name not in classes:
            raise EntryError(f"design class {name} is not defined by the oracle")
        init = next(
            (
                item
                for item in classes[name].body
                if isinstance(item, ast.FunctionDef) and item.name == "__init__"
            ),
            None,
        )
        ctor_kinds = [_kind_of(p.annotation) for p in _params(init)] if init else []
        return {"kind": "design", "class": name, "ctor_kinds": ctor_kinds}
    if "Solution" not in classes:
        raise EntryError("the oracle defines no class Solution")
    method = _choose_method(classes["Solution"], example.names)
    params = _params(method)
    cycle = _is_cycle_example(params, example)
    if cycle:
        example = FunctionExample(example.names[:-1], example.values[:-1], example.output)
    n_required = len(params) - len(method.args.defaults)
    if len(params) > len(example.names) >= n_required:
        params = params[: len(example.names)]
    if len(params) != len(example.names):
        raise EntryError(
            f"{method.name} takes {len(params)} arguments, the example gives {len(example.names)}"
        )
    kinds = [_kind_of(p.annotation) for p in params]
    returns = _kind_of(method.returns)
    returns_none = isinstance(method.returns, ast.Constant) and method.returns.value is None
    return {
        "kind": "function",
        "method": method.name,
        "params": [p.arg for p in params],
        "arg_kinds": kinds,
        "returns": returns,
        "inplace": returns_none,
        "k_prefix": example.k_prefix,
        "cycle_pos": cycle,
    }


def _is_cycle_example(params: list[ast.arg], example: FunctionExample) -> bool:
    """`head = [3,2,0,-4], pos = 1` for a method taking only head: the tail links to node pos."""
    return (
        len(example.names) == len(params) + 1
        and example.names[-1] == "pos"
        and len(params) == 1
        and _kind_of(params[0].annotation) == "linked_list"
    )


def order_arguments(entry: dict[str, Any], example: FunctionExample) -> list[Any]:
    """Example values in the method's parameter order (by name, else by position)."""
    params = entry["params"]
    if set(params) == set(example.names):
        by_name = dict(zip(example.names, example.values, strict=True))
        return [by_name[name] for name in params]
    return list(example.values)


def finalize_kinds(entry: dict[str, Any], args: list[Any]) -> list[str]:
    """A TreeNode parameter given as a plain value (e.g. `p = 5` next to `root = [...]`) names a
    node of the first tree."""
    kinds = list(entry["arg_kinds"])
    has_tree = "tree" in kinds
    for index, (kind, value) in enumerate(zip(kinds, args, strict=True)):
        if kind == "tree" and not isinstance(value, list) and value is not None and has_tree:
            kinds[index] = "tree_ref"
    if kinds and kinds[0] == "tree_ref":
        raise EntryError("a node reference needs a tree before it")
    if "node" in kinds:
        raise EntryError("inputs of the generic Node type are not supported")
    return kinds


def make_call(entry: dict[str, Any], example: ParsedExample) -> dict[str, Any]:
    """The JSON call spec the runner executes for one example (or a mutated copy of one)."""
    if entry["kind"] == "design":
        if not isinstance(example, DesignExample):
            raise EntryError("a design entry needs a design example")
        ctor_kinds = list(entry.get("ctor_kinds", []))
        if len(ctor_kinds) != len(example.args[0]):
            ctor_kinds = ["plain"] * len(example.args[0])
        if "node" in ctor_kinds:
            raise EntryError("inputs of the generic Node type are not supported")
        return {
            "kind": "design",
            "class": entry["class"],
            "ops": list(example.ops),
            "args": [list(a) for a in example.args],
            "ctor_kinds": ctor_kinds,
        }
    if not isinstance(example, FunctionExample):
        raise EntryError("a function entry needs a function example")
    if entry.get("cycle_pos"):
        by_name = dict(zip(example.names, example.values, strict=True))
        return {
            "kind": "function",
            "method": entry["method"],
            "args": [[by_name.get(entry["params"][0], example.values[0]), by_name.get("pos", -1)]],
            "arg_kinds": ["linked_list_cycle"],
            "returns": entry["returns"],
            "inplace": False,
        }
    args = order_arguments(entry, example)
    return {
        "kind": "function",
        "method": entry["method"],
        "args": args,
        "arg_kinds": finalize_kinds(entry, args),
        "returns": entry["returns"],
        "inplace": entry["inplace"],
        "with_first_arg": bool(entry.get("k_prefix")),
    }
