"""When a sequence is done: at EOS, at the close of its first fenced code block (a rewrite), or
at the end of the line that gives a score (a critique)."""

from __future__ import annotations

import re
import weakref
from typing import Any, Literal

FENCE = "```"
StopKind = Literal["code", "score", "none"]
# 'score': a critique is done at the end of the line that gives its score ("Score: 7/10").
_SCORE_LINE = re.compile(r"score\W{0,3}\d+(?:\.\d+)?(?:\s*(?:/|out of)\s*\d+)?[^\n]*\n", re.I)
# ... or once its number runs past any score's length: a small model's greedy critique can write
# '99.99999…' to the token budget (SmolLM2 on an AVX-512 CPU); what it wrote is read as it is.
_RUNAWAY_SCORE = re.compile(r"score\W{0,3}[\d.]{8}", re.I)
# A text that did not stop can only stop once it gets the last character of a match: the
# closing fence's backtick, the score line's newline, a runaway score's digit or point.
_COMPLETES = {"code": re.compile("`"), "score": re.compile(r"[\d.\n]")}
# The text of one token by tokenizer: a step's stop check looks a token up, not decodes it.
_PIECES: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


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
        piece = token_piece(self.tokenizer, token)
        self.tail += piece
        if step > 1 and not _COMPLETES[self.kind].search(piece):
            return False  # the text before did not stop, and this piece cannot complete a match
        text = self.tail
        finished = closes_code_block(text) if self.kind == "code" else gives_score(text)
        if finished:
            self.length = step
        return finished


def token_piece(tokenizer: Any, token: int) -> str:
    """`tokenizer.decode([token])`, remembered per tokenizer."""
    try:
        pieces = _PIECES.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference
        return str(tokenizer.decode([token]))
    piece = pieces.get(token)
    if piece is None:
        piece = pieces[token] = tokenizer.decode([token])
    return piece


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
