"""When a sequence is done: at EOS, at the close of its first fenced code block (a rewrite), or
at the end of the line that gives a score (a critique)."""

from __future__ import annotations

import re
from typing import Any, Literal

FENCE = "```"
StopKind = Literal["code", "score", "none"]
# 'score': a critique is done at the end of the line that gives its score ("Score: 7/10").
_SCORE_LINE = re.compile(r"score\W{0,3}\d+(?:\.\d+)?(?:\s*(?:/|out of)\s*\d+)?[^\n]*\n", re.I)
# ... or once its number runs past any score's length: a small model's greedy critique can write
# '99.99999…' to the token budget (SmolLM2 on an AVX-512 CPU); what it wrote is read as it is.
_RUNAWAY_SCORE = re.compile(r"score\W{0,3}[\d.]{8}", re.I)


class StopCondition:
    """One sequence's stop: done at EOS, or (kind 'code') when the first fenced block closes,
    or (kind 'score') at the end of the line giving a score. `length` is the completion length
    once done (the EOS token counted, padding never)."""

    def __init__(self, tokenizer: Any, eos: set[int], kind: StopKind, prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.eos = eos
        self.kind = kind
        self.tail = prefix
        self.length: int | None = None

    def update(self, token: int, step: int) -> bool:
        """Take the `step`-th new token (from 1); True once the sequence is finished."""
        if self.length is not None:
            return True
        if token in self.eos:
            self.length = step
            return True
        if self.kind == "none":
            return False
        self.tail += self.tokenizer.decode([token])
        finished = closes_code_block(self.tail) if self.kind == "code" else gives_score(self.tail)
        if finished:
            self.length = step
        return finished


def closes_code_block(text: str) -> bool:
    opening = text.find(FENCE)
    if opening < 0:
        return False
    body_start = text.find("\n", opening)
    return body_start >= 0 and text.find(FENCE, body_start) >= 0


def gives_score(text: str) -> bool:
    """A full line holding a score such as 'Score: 7/10' has been written, or a score whose
    number will not end."""
    return _SCORE_LINE.search(text) is not None or _RUNAWAY_SCORE.search(text) is not None


def cut_after_code_block(text: str) -> str:
    opening = text.find(FENCE)
    if opening < 0:
        return text
    body_start = text.find("\n", opening)
    if body_start < 0:
        return text
    closing = text.find(FENCE, body_start)
    return text if closing < 0 else text[: closing + len(FENCE)]


def eos_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's end-of-sequence id and the chat templates' end-of-turn ids it knows."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id >= 0:
            ids.add(token_id)
    return ids
