"""PrefixCache: KV caches of token sequences the model has read or written, for reuse.

A search asks for many prompts that begin like earlier ones: sibling critiques share the problem,
a critique continues the conversation that produced the rewrite it judges, and a deeper node's
prompt continues its parent's with the parent's rewrite. The prompt is looked up by its longest
common prefix with any kept sequence, and only the tokens after it go through the model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

LayerKV = tuple[Any, Any]  # (keys, values), each [1, kv_heads, length, head_dim]


@dataclass
class _Entry:
    ids: np.ndarray
    layers: list[LayerKV]


class PrefixCache:
    """Kept sequences with their KV, least recently used dropped first, within a budget of
    `max_tokens` tokens. Lookups return views of the kept KV, which nothing writes to."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.tokens = 0

    def longest_prefix(self, prompt_ids: list[int]) -> tuple[int, list[LayerKV] | None]:
        """(tokens reused, their KV or None) for the longest prefix the prompt shares with a
        kept sequence; at least one token is always left to read, since its logits start the
        completion. The KV are views of the kept tensors, which are never written to."""
        prompt = np.asarray(prompt_ids)
        best_length, best_key = 0, None
        for key, entry in self.entries.items():
            length = common_prefix_length(entry.ids, prompt)
            if length > best_length:
                best_length, best_key = length, key
        reused = min(best_length, len(prompt_ids) - 1)
        if best_key is None or reused <= 0:
            return 0, None
        self.entries.move_to_end(best_key)
        return reused, [
            (k[:, :, :reused], v[:, :, :reused]) for k, v in self.entries[best_key].layers
        ]

    def add(self, ids: list[int], layers: list[LayerKV]) -> None:
        """Keep `ids` with their KV (`layers` may be longer; only `len(ids)` positions are kept,
        as views). A sequence already covered by a longer kept one is not stored twice, and kept
        sequences it extends are replaced by it."""
        if not self.max_tokens or len(ids) > self.max_tokens or not ids:
            return
        sequence = np.asarray(ids)
        for key, entry in list(self.entries.items()):
            shared = common_prefix_length(entry.ids, sequence)
            if shared == len(sequence):  # already covered
                self.entries.move_to_end(key)
                return
            if shared == len(entry.ids):  # the new sequence extends it
                del self.entries[key]
                self.tokens -= len(entry.ids)
        kept = [(k[:, :, : len(ids)], v[:, :, : len(ids)]) for k, v in layers]
        self.entries[tuple(ids)] = _Entry(sequence, kept)
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            _, dropped = self.entries.popitem(last=False)
            self.tokens -= len(dropped.ids)

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0


def common_prefix_length(a: Any, b: Any) -> int:
    """How many leading tokens two token sequences (lists or arrays) share."""
    a, b = np.asarray(a), np.asarray(b)
    length = min(len(a), len(b))
    differs = np.flatnonzero(a[:length] != b[:length])
    return int(differs[0]) if len(differs) else length
