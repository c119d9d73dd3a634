"""How Argo judges a resource template's successCondition and failureCondition, ported so tests
can run the chart's conditions against Job status objects.

Argo's executor (workflow/executor/resource.go, v3.5 to v4.1) parses each condition with
Kubernetes' `labels.Parse` (apimachinery/pkg/labels/selector.go): comma-separated requirements,
each `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`, `key>n` or
`key<n`; keys must be qualified label names (so no gjson queries such as `#(...)`), values label
values; the parsed requirements are sorted by key. Keys are then looked up in the resource's JSON
with gjson. The step FAILS as soon as ANY failure requirement matches (message: "failure
condition '<requirement>' evaluated true") and SUCCEEDS when ALL success requirements match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_SPECIAL = set("=!(),<>")


class SelectorError(ValueError):
    """The condition would not parse in Argo (labels.Parse error)."""


def valid_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if "/" in prefix or (prefix and (len(prefix) > 253 or not re.fullmatch(_PREFIX, prefix))):
        return False
    return len(name) <= 63 and re.fullmatch(_NAME, name) is not None


def valid_value(value: str) -> bool:
    return len(value) <= 63 and (value == "" or re.fullmatch(_NAME, value) is not None)


def _tokens(text: str) -> list[str]:
    tokens, i = [], 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            tokens.append(text[i : i + 2])
            i += 2
        elif char in _SPECIAL:
            tokens.append(char)
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            tokens.append(text[i:j])
            i = j
    return tokens


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # exists, !, =, ==, !=, in, notin, >, <
    values: tuple[str, ...]

    def __str__(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return "!" + self.key
        if self.operator in ("in", "notin"):
            return f"{self.key} {self.operator} ({','.join(self.values)})"
        return f"{self.key}{self.operator}{self.values[0]}"

    def matches(self, document: Any) -> bool:
        found, value = gjson_get(document, self.key)
        if self.operator in ("=", "==", "in"):
            return found and value in self.values
        if self.operator in ("!=", "notin"):
            return not found or value not in self.values
        if self.operator == "exists":
            return found
        if self.operator == "!":
            return not found
        if not found or not re.fullmatch(r"-?\d+", value):
            return False
        number, bound = int(value), int(self.values[0])
        return number > bound if self.operator == ">" else number < bound


def parse(condition: str) -> list[Requirement]:
    """labels.Parse: requirements sorted by key; SelectorError where Kubernetes would refuse."""
    tokens = _tokens(condition)
    requirements: list[Requirement] = []
    i = 0
    while i < len(tokens):
        negated = tokens[i] == "!"
        i += negated
        if i >= len(tokens) or tokens[i] in _SPECIAL or tokens[i] in ("==", "!="):
            raise SelectorError(f"expected a key at token {i} of {condition!r}")
        key = tokens[i]
        i += 1
        if not valid_key(key):
            raise SelectorError(f"invalid label key {key!r}")
        if negated or i >= len(tokens) or tokens[i] == ",":
            requirements.append(Requirement(key, "!" if negated else "exists", ()))
        else:
            operator = tokens[i]
            i += 1
            if operator in ("in", "notin"):
                if i >= len(tokens) or tokens[i] != "(":
                    raise SelectorError(f"expected '(' after {operator}")
                values = []
                i += 1
                while i < len(tokens) and tokens[i] != ")":
                    if tokens[i] != ",":
                        values.append(tokens[i])
                    i += 1
                if i >= len(tokens):
                    raise SelectorError("missing ')'")
                i += 1
                if not values:
                    raise SelectorError(f"{key} {operator} needs at least one value")
            elif operator in ("=", "==", "!=", ">", "<"):
                if i >= len(tokens) or tokens[i] in _SPECIAL:
                    raise SelectorError(f"{key}{operator} needs a value")
                values = [tokens[i]]
                i += 1
                if operator in (">", "<") and not re.fullmatch(r"-?\d+", values[0]):
                    raise SelectorError(f"{key}{operator}{values[0]}: not an integer")
            else:
                raise SelectorError(f"unknown operator {operator!r}")
            for value in values:
                if not valid_value(value):
                    raise SelectorError(f"invalid label value {value!r}")
            requirements.append(Requirement(key, operator, tuple(sorted(values))))
        if i < len(tokens):
            if tokens[i] != ",":
                raise SelectorError(f"expected ',' at token {i} of {condition!r}")
            i += 1
    return sorted(requirements, key=lambda r: r.key)


def gjson_get(document: Any, path: str) -> tuple[bool, str]:
    """gjson's Get for plain dotted paths: (exists, String())."""
    for part in path.split("."):
        if isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        elif isinstance(document, dict) and part in document:
            document = document[part]
        else:
            return False, ""
    if isinstance(document, bool):
        return True, "true" if document else "false"
    if document is None:
        return True, ""
    if isinstance(document, (dict, list)):
        import json

        return True, json.dumps(document, separators=(",", ":"))
    return True, str(document)


def judge(success: str, failure: str, resource: dict[str, Any]) -> tuple[str, str]:
    """("failed", message) | ("succeeded", "") | ("waiting", "") as Argo's matchConditions."""
    for requirement in parse(failure) if failure else []:
        if requirement.matches(resource):
            return "failed", f"failure condition '{requirement}' evaluated true"
    needed = parse(success) if success else []
    if all(requirement.matches(resource) for requirement in needed):
        return "succeeded", ""
    return "waiting", ""
