"""Parse LeetCode statement examples: `Input: a = 1, s = "x,y"` / `Output: [1,null]` and the
class-design form (two lists on separate lines)."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

_LITERAL_WORDS = {"null": "None", "true": "True", "false": "False"}
_EXAMPLE_RE = re.compile(
    r"^\s*Input\s*:?\s*(?P<input>.*?)\n?\s*Output\s*:?\s*(?P<output>.*?)"
    r"(?:\n\s*Explanation\s*:?.*)?$",
    re.DOTALL,
)


_K_PREFIX_RE = re.compile(
    r"^(?P<k>-?\d+)\s*,\s*(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<values>\[.*?\])", re.DOTALL
)


class LiteralParseError(ValueError):
    """A statement literal or example could not be understood."""


@dataclass(frozen=True)
class FunctionExample:
    names: list[str]
    values: list[Any]
    output: Any
    # LeetCode's "return k, and the first k elements of nums" form: output is [k, prefix]
    k_prefix: bool = False


@dataclass(frozen=True)
class DesignExample:
    ops: list[str]
    args: list[list[Any]]
    output: list[Any]


ParsedExample = FunctionExample | DesignExample


def _python_words(text: str) -> str:
    """Replace null/true/false outside string literals with Python's spellings."""
    out: list[str] = []
    index = 0
    quote: str | None = None
    while index < len(text):
        char = text[index]
        if quote:
            out.append(char)
            if char == "\\" and index + 1 < len(text):
                out.append(text[index + 1])
                index += 1
            elif char == quote:
                quote = None
            index += 1
            continue
        if char in "\"'":
            quote = char
            out.append(char)
            index += 1
            continue
        match = re.match(r"[A-Za-z_]\w*", text[index:])
        if match:
            word = match.group(0)
            out.append(_LITERAL_WORDS.get(word, word))
            index += len(word)
            continue
        out.append(char)
        index += 1
    return "".join(out)


def parse_literal(text: str) -> Any:
    """A LeetCode literal (JSON-like, with null/true/false) as a Python value."""
    cleaned = text.strip().rstrip(",").strip()
    if not cleaned:
        raise LiteralParseError("empty literal")
    try:
        return json.loads(cleaned)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(_python_words(cleaned))
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise LiteralParseError(f"not a literal: {cleaned[:60]!r}") from exc
    return _tuples_to_lists(value)


def _tuples_to_lists(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_tuples_to_lists(item) for item in value]
    if isinstance(value, set):
        raise LiteralParseError("set literals are not LeetCode values")
    if isinstance(value, dict):
        raise LiteralParseError("dict literals are not LeetCode values")
    return value


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """Split on separators that are outside brackets and string literals."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    start = 0
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
        index += 1
    parts.append(text[start:])
    return parts


def parse_assignments(text: str) -> tuple[list[str], list[Any]]:
    """`a = 1, b = [1,2]` -> (["a", "b"], [1, [1, 2]]). Pieces without `name =` join the
    previous value (a comma inside an unquoted value)."""
    names: list[str] = []
    raw_values: list[str] = []
    for piece in split_top_level(text.replace("\n", " ")):
        match = re.match(r"\s*([A-Za-z_]\w*)\s*=(?!=)\s*(.*)$", piece, re.DOTALL)
        if match:
            names.append(match.group(1))
            raw_values.append(match.group(2))
        elif raw_values:
            raw_values[-1] += "," + piece
        elif piece.strip():
            raise LiteralParseError(f"input piece without a name: {piece.strip()[:40]!r}")
    if not names:
        raise LiteralParseError("no `name = value` in the input")
    return names, [parse_literal(raw) for raw in raw_values]


def _parse_design(input_text: str, output_text: str) -> DesignExample:
    lines = [line for line in input_text.strip().splitlines() if line.strip()]
    if len(lines) == 2:
        ops, args = parse_literal(lines[0]), parse_literal(lines[1])
    else:
        pieces = parse_literal("[" + ",".join(lines) + "]")
        if len(pieces) != 2:
            raise LiteralParseError("design input must be two lists")
        ops, args = pieces
    output = parse_literal(output_text)
    valid = (
        isinstance(ops, list)
        and all(isinstance(op, str) for op in ops)
        and isinstance(args, list)
        and all(isinstance(arg, list) for arg in args)
        and isinstance(output, list)
        and len(ops) == len(args) == len(output)
        and len(ops) >= 1
    )
    if not valid:
        raise LiteralParseError("design example: operations, arguments and outputs do not match")
    return DesignExample(ops=ops, args=args, output=output)


def parse_example(text: str) -> ParsedExample:
    """One statement example ('Input: ...\\nOutput: ...\\nExplanation: ...')."""
    match = _EXAMPLE_RE.match(text.replace("\r\n", "\n").replace("\xa0", " "))
    if not match:
        raise LiteralParseError("example has no Input/Output")
    input_text = match.group("input").strip()
    output_text = match.group("output").strip()
    if not output_text:
        raise LiteralParseError("example has an empty output")
    if input_text.startswith("[") and re.match(r"\[\s*\"", input_text):
        return _parse_design(input_text, output_text)
    names, values = parse_assignments(input_text)
    k_prefix = _K_PREFIX_RE.match(output_text)
    if k_prefix and k_prefix.group("name") in names:
        k = int(k_prefix.group("k"))
        prefix = parse_literal(re.sub(r"\b_\b", "null", k_prefix.group("values")))
        if not isinstance(prefix, list) or len(prefix) < k:
            raise LiteralParseError("k-prefix output shorter than k")
        return FunctionExample(names, values, [k, prefix[:k]], k_prefix=True)
    return FunctionExample(names=names, values=values, output=parse_literal(output_text))
