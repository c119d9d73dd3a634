"""Hidden-test inputs: seeded mutations of the statement's example inputs that keep types,
shapes, sortedness, distinctness, equal-length relations and the bounds stated in the
constraints. Expected outputs come later from running the oracle (inputs it rejects are
discarded), so a mutation only has to be plausible, never correct."""

from __future__ import annotations

import copy
import json
import random
import re
import string
from dataclasses import dataclass, field
from typing import Any

from codeq.tasks.literals import DesignExample, FunctionExample, ParsedExample

_BOUND_RE = re.compile(
    r"(?P<lo>-?\s*\d+(?:\s*\*\s*\d+)?(?:\s*\^\s*\d+)?)\s*<=?\s*(?P<names>[^<>=]+?)\s*<=?\s*"
    r"(?P<hi>-?\s*\d+(?:\s*\*\s*\d+)?(?:\s*\^\s*\d+)?(?:\s*-\s*1\b)?)"
)


def decode_number(text: str) -> int:
    """A bound as printed in a scraped statement, where superscripts were flattened:
    '104' means 10^4, '2 * 105' 2*10^5, '231 - 1' 2^31 - 1."""
    cleaned = text.replace(" ", "")
    negative = cleaned.startswith("-")
    cleaned = cleaned.lstrip("-")
    minus_one = cleaned.endswith("-1") and len(cleaned) > 2
    if minus_one:
        cleaned = cleaned[:-2]
    factor = 1
    if "*" in cleaned:
        head, cleaned = cleaned.split("*", 1)
        factor = int(head)
    if "^" in cleaned:
        base, exponent = cleaned.split("^", 1)
        value = int(base) ** int(exponent)
    elif re.fullmatch(r"10[1-9]", cleaned):
        value = 10 ** int(cleaned[2])
    elif re.fullmatch(r"2(3[1-2]|6[3-4])", cleaned):
        value = 2 ** int(cleaned[1:])
    else:
        value = int(cleaned)
    value = factor * value - (1 if minus_one else 0)
    return -value if negative else value


@dataclass
class Bounds:
    value: dict[str, tuple[int, int]] = field(default_factory=dict)
    length: dict[str, tuple[int, int]] = field(default_factory=dict)


def parse_bounds(constraints: str) -> Bounds:
    """`lo <= name <= hi` lines: element/value bounds and `.length` bounds per argument name."""
    bounds = Bounds()
    for line in constraints.replace("\xa0", " ").splitlines():
        for match in _BOUND_RE.finditer(line):
            try:
                lo, hi = decode_number(match.group("lo")), decode_number(match.group("hi"))
            except ValueError:
                continue
            if lo > hi:
                continue
            for raw_name in match.group("names").split(","):
                name = raw_name.strip()
                base = re.match(r"[A-Za-z_]\w*", name)
                if not base:
                    continue
                target = bounds.length if name.endswith((".length", ".size()")) else bounds.value
                target.setdefault(base.group(0), (lo, hi))
    return bounds


@dataclass
class ArgProfile:
    """What all examples show about one argument."""

    ints: list[int] = field(default_factory=list)
    floats: list[float] = field(default_factory=list)
    chars: set[str] = field(default_factory=set)
    lengths: list[int] = field(default_factory=list)
    sorted_asc: bool = True
    sorted_desc: bool = True
    distinct: bool = True
    has_list: bool = False


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _profile(values: list[Any]) -> ArgProfile:
    profile = ArgProfile()
    for value in values:
        for leaf in _leaves(value):
            if isinstance(leaf, bool):
                continue
            if isinstance(leaf, int):
                profile.ints.append(leaf)
            elif isinstance(leaf, float):
                profile.floats.append(leaf)
            elif isinstance(leaf, str):
                profile.chars.update(leaf)
        if isinstance(value, list | str):
            profile.lengths.append(len(value))
        if isinstance(value, list):
            profile.has_list = True
            flat = [leaf for leaf in value if not isinstance(leaf, list)]
            if len(flat) == len(value):
                profile.sorted_asc &= _is_sorted(flat, reverse=False)
                profile.sorted_desc &= _is_sorted(flat, reverse=True)
                profile.distinct &= len({json.dumps(v) for v in flat}) == len(flat)
            else:
                profile.sorted_asc = profile.sorted_desc = False
                profile.distinct = False
    return profile


def _is_sorted(values: list[Any], reverse: bool) -> bool:
    try:
        return values == sorted(values, reverse=reverse) and len(values) > 1
    except TypeError:
        return False


class Mutator:
    """Deterministic candidate inputs for one task (seeded by the caller)."""

    def __init__(self, examples: list[ParsedExample], constraints: str, rng: random.Random):
        self.examples = examples
        self.rng = rng
        self.bounds = parse_bounds(constraints)
        self.function_examples = [e for e in examples if isinstance(e, FunctionExample)]
        names = self.function_examples[0].names if self.function_examples else []
        self.names = names
        self.profiles = {
            name: _profile([e.values[i] for e in self.function_examples if len(e.values) > i])
            for i, name in enumerate(names)
        }
        self.length_groups = self._length_groups()
        self.int_ties = self._int_ties()
        self.leaf_caps = self._leaf_caps()
        self.relabel = self._relabel_plan()
        self.tree_like = {
            name: any(
                isinstance(e.values[i], list) and None in e.values[i]
                for e in self.function_examples
                if len(e.values) > i
            )
            for i, name in enumerate(names)
        }

    # relations that every example shows -------------------------------------------------
    def _sized(self, example: FunctionExample, index: int) -> int | None:
        value = example.values[index]
        return len(value) if isinstance(value, list | str) else None

    def _length_groups(self) -> list[list[int]]:
        """Argument indexes whose lengths are equal in every example (nums1/nums2 pairs)."""
        groups: list[list[int]] = []
        for index in range(len(self.names)):
            if any(self._sized(e, index) is None for e in self.function_examples):
                continue
            for group in groups:
                if all(
                    self._sized(e, index) == self._sized(e, group[0])
                    for e in self.function_examples
                ):
                    group.append(index)
                    break
            else:
                groups.append([index])
        return groups

    def _int_ties(self) -> dict[int, tuple[str, int]]:
        """int argument -> ("equal" | "at_most", list argument) when every example shows it."""
        ties: dict[int, tuple[str, int]] = {}
        for index in range(len(self.names)):
            if not all(
                isinstance(e.values[index], int) and not isinstance(e.values[index], bool)
                for e in self.function_examples
            ):
                continue
            for other in range(len(self.names)):
                sizes = [self._sized(e, other) for e in self.function_examples]
                if other == index or any(size is None for size in sizes):
                    continue
                values = [e.values[index] for e in self.function_examples]
                if all(v == s for v, s in zip(values, sizes, strict=True)):
                    ties[index] = ("equal", other)
                    break
                if all(0 <= v <= s for v, s in zip(values, sizes, strict=True) if s is not None):  # type: ignore[operator]
                    ties.setdefault(index, ("at_most", other))
        return ties

    def _reference(self, values: list[Any], other: int) -> int | None:
        value = values[other]
        if isinstance(value, list | str):
            return len(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return None

    def _leaf_caps(self) -> dict[tuple[int, int | None], tuple[int, int]]:
        """(list argument, column or None) -> (argument, offset): every int there stays below
        (offset 1) or at most (offset 0) another argument's value or length, in every example,
        e.g. node ids in `edges` below `n`, or `edges[i] < edges.length`."""
        caps: dict[tuple[int, int | None], tuple[int, int]] = {}
        examples = self.function_examples
        for index in range(len(self.names)):
            if not all(isinstance(e.values[index], list) for e in examples):
                continue
            for column in _columns(examples, index):
                maxima = [_max_int_leaf(_column(e.values[index], column)) for e in examples]
                if all(m is None for m in maxima):
                    continue
                for other in range(len(self.names)):
                    refs = [self._reference(e.values, other) for e in examples]
                    if any(r is None for r in refs):
                        continue
                    pairs = [(m, r) for m, r in zip(maxima, refs, strict=True) if m is not None]
                    if all(m < r for m, r in pairs):  # type: ignore[operator]
                        caps[(index, column)] = (other, 1)
                        break
                    if all(m <= r for m, r in pairs):  # type: ignore[operator]
                        caps[(index, column)] = (other, 0)
                        break
        return caps

    def _relabel_plan(self) -> tuple[int, int, list[int]] | None:
        """Graph inputs (`edges` whose node ids stay below an int `n`) keep their structure: a
        random change of ids could turn a tree into a cycle, so ids are permuted instead.
        Returns (n's index, id offset, argument indexes to relabel)."""
        for (index, _column), (other, offset) in self.leaf_caps.items():
            value = self.function_examples[0].values[other]
            if not _GRAPH_NAME.search(self.names[index]) or not isinstance(value, int):
                continue
            targets = sorted(
                {i for (i, _c), (o, off) in self.leaf_caps.items() if o == other and off == offset}
                | {
                    i
                    for i, name in enumerate(self.names)
                    if _NODE_NAME.search(name) and i != other and self._ids_below(i, other, offset)
                }
            )
            return other, offset, targets
        return None

    def _ids_below(self, index: int, other: int, offset: int) -> bool:
        return all(
            isinstance(e.values[index], int)
            and not isinstance(e.values[index], bool)
            and e.values[index] <= e.values[other] - offset
            for e in self.function_examples
        )

    def _relabelled(self, example: FunctionExample) -> FunctionExample:
        assert self.relabel is not None
        other, offset, targets = self.relabel
        n = example.values[other]
        first = 1 - offset  # ids are 0..n-1 (below n) or 1..n (at most n)
        ids = list(range(first, first + n))
        shuffled = ids[:]
        self.rng.shuffle(shuffled)
        mapping = dict(zip(ids, shuffled, strict=True))
        values = list(example.values)
        for index in targets:
            values[index] = _map_ints(values[index], mapping)
        return FunctionExample(names=list(example.names), values=values, output=None)

    # scalar mutations ----------------------------------------------------------------------
    def _int_range(self, name: str, observed: list[int]) -> tuple[int, int]:
        if not observed:
            observed = [0, 10]
        low, high = min(observed), max(observed)
        span = max(5, high - low)
        lo, hi = low - span, high + span
        if low >= 0:
            lo = max(lo, 0 if low == 0 else 1)
        if name in self.bounds.value:
            bound_lo, bound_hi = self.bounds.value[name]
            lo, hi = max(lo, bound_lo), min(hi, bound_hi)
        return (lo, hi) if lo <= hi else (low, high)

    def _new_int(self, name: str, value: int, observed: list[int]) -> int:
        lo, hi = self._int_range(name, observed)
        if self.rng.random() < 0.5:
            return min(hi, max(lo, value + self.rng.choice([-2, -1, 1, 2])))
        return self.rng.randint(lo, hi)

    def _new_char(self, char: str, pool: set[str]) -> str:
        for group in (string.ascii_lowercase, string.ascii_uppercase, string.digits):
            if char in group:
                choices = sorted(c for c in pool if c in group) or [char]
                return self.rng.choice(choices)
        return char

    def _mutate_string(self, text: str, pool: set[str], new_length: int | None) -> str:
        chars = list(text)
        for _ in range(max(1, len(chars) // 3)):
            if chars:
                position = self.rng.randrange(len(chars))
                chars[position] = self._new_char(chars[position], pool)
        if new_length is not None:
            while len(chars) > new_length and chars:
                del chars[self.rng.randrange(len(chars))]
            while len(chars) < new_length and chars:
                chars.insert(self.rng.randrange(len(chars) + 1), self.rng.choice(chars))
        if chars and text and text[0] != "0" and chars[0] == "0" and len(chars) > 1:
            chars[0] = text[0]
        return "".join(chars)

    # structured mutations -----------------------------------------------------------------
    def _mutate_leaf(self, name: str, leaf: Any, profile: ArgProfile) -> Any:
        if isinstance(leaf, bool):
            return self.rng.random() < 0.5
        if isinstance(leaf, int):
            return self._new_int(name, leaf, profile.ints)
        if isinstance(leaf, float):
            return round(leaf * self.rng.uniform(0.5, 1.5), 5)
        if isinstance(leaf, str):
            return self._mutate_string(leaf, profile.chars, None)
        return leaf

    def _mutate_list(
        self, name: str, value: list[Any], profile: ArgProfile, new_length: int
    ) -> list[Any]:
        if self.tree_like.get(name):
            return self._mutate_tree(name, value, profile)
        items = copy.deepcopy(value)
        if items and all(isinstance(item, list) for item in items):
            rectangular = len({len(item) for item in items}) == 1
            items = [
                [
                    self._mutate_leaf(name, leaf, profile) if self.rng.random() < 0.4 else leaf
                    for leaf in row
                ]
                if not any(isinstance(leaf, list) for leaf in row)
                else row
                for row in items
            ]
            if not rectangular or len(items[0]) <= 3:
                items = self._resize(items, new_length)
            return items
        for _ in range(max(1, len(items) // 3)):
            if items:
                position = self.rng.randrange(len(items))
                items[position] = self._mutate_leaf(name, items[position], profile)
        if self.rng.random() < 0.3:
            self.rng.shuffle(items)
        items = self._resize(items, new_length)
        return self._restore_order(name, items, profile)

    def _resize(self, items: list[Any], new_length: int) -> list[Any]:
        while len(items) > new_length and items:
            del items[self.rng.randrange(len(items))]
        while len(items) < new_length and items:
            items.insert(self.rng.randrange(len(items) + 1), copy.deepcopy(self.rng.choice(items)))
        return items

    def _restore_order(self, name: str, items: list[Any], profile: ArgProfile) -> list[Any]:
        if profile.distinct and all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            lo, hi = self._int_range(name, profile.ints)
            seen: set[int] = set()
            for index, item in enumerate(items):
                attempts = 0
                while item in seen and attempts < 50:
                    item = self.rng.randint(lo, max(hi, lo + len(items)))
                    attempts += 1
                items[index] = item
                seen.add(item)
        try:
            if profile.sorted_asc:
                items.sort()
            elif profile.sorted_desc:
                items.sort(reverse=True)
        except TypeError:
            pass
        return items

    def _mutate_tree(self, name: str, values: list[Any], profile: ArgProfile) -> list[Any]:
        """Keep the tree's shape; new values keep the old ones' order (BSTs stay BSTs)."""
        present = [v for v in values if v is not None]
        if not present or not all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            return list(values)
        lo, hi = self._int_range(name, profile.ints)
        distinct = sorted(set(present))
        if hi - lo + 1 < len(distinct):
            return list(values)
        fresh = sorted(self.rng.sample(range(lo, hi + 1), len(distinct)))
        remap = dict(zip(distinct, fresh, strict=True))
        return [None if v is None else remap[v] for v in values]

    def _new_length(self, index: int, example: FunctionExample) -> int:
        name = self.names[index]
        current = self._sized(example, index) or 0
        observed = self.profiles[name].lengths or [current]
        lo = max(0 if min(observed) == 0 else 1, min(observed) - 1)
        hi = max(observed) + 2
        if name in self.bounds.length:
            bound_lo, bound_hi = self.bounds.length[name]
            lo, hi = max(lo, bound_lo), min(hi, bound_hi)
        if self.rng.random() < 0.5 or lo > hi:
            return current
        return self.rng.randint(lo, hi)

    def mutate_function(self, example: FunctionExample) -> FunctionExample:
        if self.relabel is not None:
            relabelled = self._relabelled(example)
            other, _offset, targets = self.relabel
            frozen = {other, *targets}
            values = list(relabelled.values)
            for index, name in enumerate(self.names):
                value = values[index]
                if index in frozen or self.rng.random() < 0.5:
                    continue
                profile = self.profiles[name]
                if isinstance(value, list):
                    values[index] = self._mutate_list(name, value, profile, len(value))
                elif isinstance(value, str):
                    values[index] = self._mutate_string(value, profile.chars, len(value))
                else:
                    values[index] = self._mutate_leaf(name, value, profile)
            return FunctionExample(names=list(example.names), values=values, output=None)
        lengths: dict[int, int] = {}
        for group in self.length_groups:
            length = self._new_length(group[0], example)
            for index in group:
                lengths[index] = length
        values = list(example.values)
        mutate_all = self.rng.random() < 0.5
        for index, name in enumerate(self.names):
            value, profile = values[index], self.profiles[name]
            resized = isinstance(value, list | str) and lengths.get(index, len(value)) != len(value)
            if index in self.int_ties or not (mutate_all or resized or self.rng.random() < 0.6):
                continue
            if isinstance(value, list):
                values[index] = self._mutate_list(
                    name, value, profile, lengths.get(index, len(value))
                )
            elif isinstance(value, str):
                values[index] = self._mutate_string(value, profile.chars, lengths.get(index))
            else:
                values[index] = self._mutate_leaf(name, value, profile)
        for index, (relation, other) in self.int_ties.items():
            size = len(values[other])
            if relation == "equal":
                values[index] = size
            elif self.rng.random() < 0.7:
                low = 1 if min(self.profiles[self.names[index]].ints or [0]) >= 1 else 0
                values[index] = self.rng.randint(min(low, size), size) if size >= low else size
        for (index, column), (other, offset) in self.leaf_caps.items():
            reference = self._reference(values, other)
            if reference is not None:
                values[index] = _cap_column(values[index], column, reference - offset)
        return FunctionExample(names=list(example.names), values=values, output=None)

    def mutate_design(self, example: DesignExample) -> DesignExample:
        ints = [
            leaf
            for args in example.args
            for leaf in _leaves(args)
            if isinstance(leaf, int) and not isinstance(leaf, bool)
        ]
        profile = ArgProfile(ints=ints)
        keep = len(example.ops)
        if self.rng.random() < 0.4 and keep > 2:
            keep = self.rng.randint(2, keep - 1)
        args = [
            [
                self._mutate_leaf("", leaf, profile) if self.rng.random() < 0.5 else leaf
                for leaf in op_args
            ]
            if position > 0
            else list(op_args)
            for position, op_args in enumerate(example.args[:keep])
        ]
        return DesignExample(ops=list(example.ops[:keep]), args=args, output=[])

    def candidates(self, wanted: int, attempts: int) -> list[ParsedExample]:
        """Up to `wanted` distinct mutated inputs, none equal to an example input."""
        seen = {_input_key(e) for e in self.examples}
        found: list[ParsedExample] = []
        for attempt in range(attempts):
            base = self.examples[attempt % len(self.examples)]
            try:
                candidate: ParsedExample = (
                    self.mutate_design(base)
                    if isinstance(base, DesignExample)
                    else self.mutate_function(base)
                )
            except (ValueError, TypeError, IndexError):
                continue
            key = _input_key(candidate)
            if key in seen:
                continue
            seen.add(key)
            found.append(candidate)
            if len(found) >= wanted:
                break
        return found


_GRAPH_NAME = re.compile(r"edge|road|connection|graph|adj|trip|path|link", re.I)
_NODE_NAME = re.compile(r"node|start|end|src|dst|source|target|dest|from|to|root|city", re.I)


def _map_ints(value: Any, mapping: dict[int, int]) -> Any:
    if isinstance(value, list):
        return [_map_ints(item, mapping) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return mapping.get(value, value)
    return value


def _max_int_leaf(value: Any) -> int | None:
    ints = [leaf for leaf in _leaves(value) if isinstance(leaf, int) and not isinstance(leaf, bool)]
    return max(ints) if ints else None


def _cap_leaves(value: Any, cap: int) -> Any:
    if isinstance(value, list):
        return [_cap_leaves(item, cap) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return min(value, cap)
    return value


def _columns(examples: list[FunctionExample], index: int) -> list[int | None]:
    """Columns of a list of equal-width rows (bookings [first, last, seats]); else [None]."""
    widths = {
        len(row) if isinstance(row, list) else -1 for e in examples for row in e.values[index]
    }
    if len(widths) == 1 and (width := widths.pop()) > 0:
        return list(range(width))
    return [None]


def _column(value: list[Any], column: int | None) -> Any:
    if column is None:
        return value
    return [row[column] for row in value if isinstance(row, list) and len(row) > column]


def _cap_column(value: Any, column: int | None, cap: int) -> Any:
    if column is None or not isinstance(value, list):
        return _cap_leaves(value, cap)
    return [
        [
            _cap_leaves(leaf, cap) if position == column else leaf
            for position, leaf in enumerate(row)
        ]
        if isinstance(row, list)
        else row
        for row in value
    ]


def _input_key(example: ParsedExample) -> str:
    if isinstance(example, DesignExample):
        return json.dumps([example.ops, example.args])
    return json.dumps(example.values)
