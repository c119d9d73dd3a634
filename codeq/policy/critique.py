"""Self-critique: the policy scores a candidate rewrite; the score becomes Q_ai in [0, 1]."""

from __future__ import annotations

import re
from collections.abc import Sequence

from codeq.policy.engine import GenerationRequest
from codeq.schemas import ChatMessage

# Kept short: every critique reads it after its own conversation, and critique reads were 40%
# of all prompt tokens read in the search bench (30 tokens now, 54 before).
CRITIQUE_INSTRUCTION = (
    "How likely is the program in your last answer to pass all tests, hidden ones too? "
    "Answer with one line 'Score: N/10'."
)
NEUTRAL_SCORE = 0.5
SCORE_PREFIX = "Score: "  # the answer is started for the model, so it writes a number next


def critique_messages(conversation: Sequence[ChatMessage], answer: str) -> list[ChatMessage]:
    """The conversation that produced a rewrite, the rewrite as the model's answer, then the
    request to score it. Self-critique in context: the model judges its own answer knowing the
    problem and any feedback it was given, and the conversation's KV, kept by the engine when
    it wrote the answer, is reused rather than read again."""
    return [
        *conversation,
        ChatMessage(role="assistant", content=answer),
        ChatMessage(role="user", content=CRITIQUE_INSTRUCTION),
    ]


def critique_request(
    conversation: Sequence[ChatMessage],
    answer: str,
    *,
    temperature: float = 0.2,
    max_new_tokens: int = 128,
    seed: int | None = None,
) -> GenerationRequest:
    """One critique sample of the rewrite `answer` (CodeQ samples critiques at temperature 0.2)."""
    return GenerationRequest(
        messages=critique_messages(conversation, answer),
        n=1,
        temperature=temperature,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        prefix=SCORE_PREFIX,
        stop="score",
        seed=seed,
    )


_NUMBER = r"(\d+(?:\.\d+)?)"
_SCORE_RE = re.compile(rf"score\W{{0,3}}{_NUMBER}(?:\s*(?:/|out of)\s*{_NUMBER})?", re.IGNORECASE)
_RATIO_RE = re.compile(rf"{_NUMBER}\s*(?:/|out of)\s*{_NUMBER}", re.IGNORECASE)
_PERCENT_RE = re.compile(rf"{_NUMBER}\s*%")
_BARE_RE = re.compile(rf"(?<![\w.]){_NUMBER}(?![\w.])")


def parse_score(text: str) -> float | None:
    """A critique's score in [0, 1], or None when it names none.

    Accepts 'Score: 7/10', 'score = 0.7', '7 out of 10', '70%', and as a last resort the first
    bare number in 0..10. A score without a scale is read on 0..10 (or 0..1 if it is <= 1 and
    has a decimal point, or 0..100 if above 10)."""
    for pattern in (_SCORE_RE, _RATIO_RE):
        match = pattern.search(text)
        if match:
            return _scaled(match.group(1), match.group(2))
    match = _PERCENT_RE.search(text)
    if match:
        return _clamp(float(match.group(1)) / 100.0)
    for match in _BARE_RE.finditer(text):
        value = float(match.group(1))
        if 0 <= value <= 10:
            return _scaled(match.group(1), None)
    return None


def _scaled(number: str, scale: str | None) -> float:
    value = float(number)
    if scale is not None and float(scale) > 0:
        return _clamp(value / float(scale))
    if "." in number and value <= 1.0:
        return _clamp(value)
    return _clamp(value / (100.0 if value > 10 else 10.0))


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def q_ai_from(texts: Sequence[str], prefix: str = "") -> float:
    """Mean parsed score over critique samples (each read after `prefix`, the answer's start
    that the model continued); the neutral 0.5 when none parses."""
    scores = [s for s in (parse_score(prefix + t) for t in texts) if s is not None]
    return sum(scores) / len(scores) if scores else NEUTRAL_SCORE
