"""Prompts for rewrites and the extraction of the rewritten program from the model's answer.

Only the problem statement, its visible examples, programs and feedback from failing *visible*
tests ever enter a prompt; hidden tests never do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from codeq.schemas import ChatMessage, Task, TestCase, TestOutcome

SYSTEM_PROMPT = (
    "You are an expert Python programmer who fixes bugs. Read the problem and the buggy program, "
    "find every bug, and answer with the complete corrected program in one ```python code block."
)
FIX_INSTRUCTION = (
    "Fix the bugs in this program. Keep the class and method signatures. Reply with the full "
    "corrected program in a single ```python code block."
)
MAX_FEEDBACK_TESTS = 3
MAX_FEEDBACK_CHARS = 300


def fenced(code: str) -> str:
    """`code` in a ```python block."""
    return f"```python\n{code.rstrip()}\n```"


def problem_text(task: Task) -> str:
    """The statement, visible examples and constraints (never the hidden tests)."""
    parts = [f"Problem:\n{task.description.strip()}"]
    if task.examples:
        examples = "\n\n".join(f"Example {i}:\n{e.strip()}" for i, e in enumerate(task.examples, 1))
        parts.append(examples)
    if task.constraints.strip():
        parts.append(f"Constraints:\n{task.constraints.strip()}")
    return "\n\n".join(parts)


def first_turn_messages(
    task: Task, style: str = "plain", code: str | None = None, feedback: str = ""
) -> list[ChatMessage]:
    """The first turn of a repair (`search.prompt`): 'plain' or 'detailed'. `code` (default: the
    buggy program) and `feedback` (what its visible tests got) make it a one-turn refinement."""
    if style == "plain":
        return plain_messages(task, code, feedback)
    if style == "detailed":
        return agent_messages(task, code, feedback)
    raise ValueError(f"unknown prompt style {style!r}: use 'plain' or 'detailed'")


def _with_feedback(feedback: str) -> str:
    return f"{feedback}\n\n" if feedback else ""


def agent_messages(task: Task, code: str | None = None, feedback: str = "") -> list[ChatMessage]:
    """The detailed first turn: a system prompt, the problem, examples, the buggy program."""
    program = task.buggy_code if code is None else code
    user = (
        f"{problem_text(task)}\n\nBuggy program:\n{fenced(program)}\n\n"
        f"{_with_feedback(feedback)}{FIX_INSTRUCTION}"
    )
    return [
        ChatMessage(role="system", content=SYSTEM_PROMPT),
        ChatMessage(role="user", content=user),
    ]


def plain_messages(task: Task, code: str | None = None, feedback: str = "") -> list[ChatMessage]:
    """The plain first turn, also the zero-shot baseline's: the statement and the buggy code."""
    program = task.buggy_code if code is None else code
    user = (
        f"{task.description.strip()}\n\n{fenced(program)}\n\n"
        f"{_with_feedback(feedback)}Fix the bug and give the corrected code."
    )
    return [ChatMessage(role="user", content=user)]


@dataclass(frozen=True)
class FailedTest:
    """One failing visible test, as shown to the model."""

    call: str
    expected: str
    got: str


def visible_failures(
    task: Task, outcomes: Sequence[TestOutcome], limit: int = MAX_FEEDBACK_TESTS
) -> list[FailedTest]:
    """Failing tests among the *visible* ones. `outcomes` are aligned with
    `task.tests(...)`, which always lists visible tests first; anything past them is ignored."""
    failures: list[FailedTest] = []
    for test, outcome in zip(task.visible_tests, outcomes, strict=False):
        if outcome.passed:
            continue
        failures.append(
            FailedTest(
                call=_clip(describe_call(test)),
                expected=_clip(json.dumps(test.expected)),
                got=_clip(outcome.detail or outcome.status),
            )
        )
        if len(failures) >= limit:
            break
    return failures


def describe_call(test: TestCase) -> str:
    """A readable form of a harness call: `method(arg, ...)` or the design ops and arguments."""
    call: dict[str, Any] = test.call
    if call.get("kind") == "function" and "method" in call:
        args = ", ".join(json.dumps(arg) for arg in call.get("args", []))
        return f"{call['method']}({args})"
    if call.get("kind") == "design":
        return f"{json.dumps(call.get('ops', []))} {json.dumps(call.get('args', []))}"
    return json.dumps(call)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_FEEDBACK_CHARS else text[:MAX_FEEDBACK_CHARS] + "..."


PASSES_EXAMPLES = (
    "Your program passes the examples. Check it carefully against the problem statement "
    "for remaining bugs and edge cases."
)


ONE_TURN_PASSES_EXAMPLES = (
    "This program passes the examples. Check it carefully against the problem statement for "
    "remaining bugs and edge cases."
)


def _failure_lines(failures: Sequence[FailedTest]) -> list[str]:
    return [
        f"Input: {failure.call}\nExpected: {failure.expected}\nGot: {failure.got}"
        for failure in failures
    ]


def feedback_text(failures: Sequence[FailedTest]) -> str:
    """Feedback from failing *visible* tests only. When every visible test passes, nothing about
    other tests is said: hidden outcomes never reach a prompt."""
    if not failures:
        return f"{PASSES_EXAMPLES} {FIX_INSTRUCTION}"
    return "\n\n".join(
        ["Your program fails these tests:", *_failure_lines(failures), FIX_INSTRUCTION]
    )


def one_turn_feedback_text(failures: Sequence[FailedTest]) -> str:
    """The same feedback for a one-turn refinement, where the program is shown as the code to
    fix rather than as the model's own answer (the first turn's instruction follows it)."""
    if not failures:
        return ONE_TURN_PASSES_EXAMPLES
    return "\n\n".join(["This program fails these tests:", *_failure_lines(failures)])


def asks_past_passing_examples(messages: Sequence[ChatMessage]) -> bool:
    """Whether this prompt refines a program that already passes every visible test. A search
    rewarded by visible tests stops at such a program, so evaluation never asks this."""
    if not messages or messages[-1].role != "user":
        return False
    content = messages[-1].content
    return content.startswith(PASSES_EXAMPLES) or ONE_TURN_PASSES_EXAMPLES in content


def refine_messages(
    task: Task, parent_answer: str, failures: Sequence[FailedTest], style: str = "plain"
) -> list[ChatMessage]:
    """Multi-turn prompt for a deeper node: the first turn (in `style`), the parent's answer
    (the model's own words with its rewrite, as muCode's multi-turn prompts keep them), then
    feedback from the parent's failing visible tests."""
    return [
        *first_turn_messages(task, style),
        ChatMessage(role="assistant", content=parent_answer),
        ChatMessage(role="user", content=feedback_text(failures)),
    ]


def one_turn_refine_messages(
    task: Task, parent_program: str, failures: Sequence[FailedTest], style: str = "plain"
) -> list[ChatMessage]:
    """A deeper node's prompt in one turn (`search.refine: one_turn`): the first turn (in
    `style`) with the parent's program in place of the buggy one and its failing visible tests
    before the instruction. Qwen2.5-Coder-0.5B mostly repeats a program it is shown as its own
    earlier answer (docs/results.md)."""
    return first_turn_messages(task, style, parent_program, one_turn_feedback_text(failures))


# ---------------------------------------------------------------- extraction

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_START = re.compile(r"^(class |def |import |from |@)", re.MULTILINE)


def extract_program(text: str) -> str:
    """The rewritten program in a model answer: the last fenced block that looks like Python
    (an unterminated last block counts); else the text from the first `class`/`def`/`import`
    line; else ''."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(text)]
    python_blocks = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    for body in reversed(python_blocks):
        if body.strip():
            return _normalize(body)
    match = _CODE_START.search(text)
    if match:
        return _normalize(text[match.start() :].split("```")[0])
    return ""


def _normalize(code: str) -> str:
    return code.strip("\n").rstrip() + "\n" if code.strip() else ""


def same_program(a: str, b: str) -> bool:
    """Equal up to trailing whitespace and blank lines."""

    def canon(code: str) -> list[str]:
        return [line.rstrip() for line in code.strip().splitlines() if line.strip()]

    return canon(a) == canon(b)


def is_valid_rewrite(program: str, *originals: str) -> bool:
    """Non-empty and different from every program it rewrites."""
    return bool(program.strip()) and not any(same_program(program, o) for o in originals)
