"""PromptBatch: the uncached tails of several prompts read in one forward.

Each prompt may start with a prefix whose KV is already cached (see `PrefixCache`); only its
tail goes through the model. Reading tails one prompt at a time pays a fixed cost per forward
and runs matmuls over few rows; in one batch the tails are left-padded to one width, so every
prompt's last token sits in the last column (its logits are the only ones computed):

    prefix part  [P, kv_heads, prefix_width, head_dim]  cached, right-padded
    tail part    [P, kv_heads, tail_width, head_dim]    computed now, left-padded

Each query sees its prompt's prefix and the tail tokens up to itself; padding is masked.
"""

from __future__ import annotations

from typing import Any

from codeq.policy.decode_batch import (
    attention_bias,
    merge_partials,
    partial_attention,
    stack_prompts,
)
from codeq.policy.prefix_cache import LayerKV


class PromptBatch:
    def __init__(self, prefixes: list[list[LayerKV]], tail_lengths: list[int]) -> None:
        import torch

        self.device = prefixes[0][0][0].device
        self.prefix_keys, self.prefix_values, lengths, self.prefix_bias = stack_prompts(prefixes)
        self.prefix_lengths = lengths.tolist()
        self.no_prefix = lengths == 0
        self.tail_lengths = tail_lengths
        self.width = max(tail_lengths)
        self.tail_keys: list[Any] = [None] * len(self.prefix_keys)
        self.tail_values: list[Any] = [None] * len(self.prefix_keys)
        # [P, 1, width, width]: causal over the tail, padding hidden (a padding query sees
        # itself, so no softmax is empty)
        pads = torch.tensor([self.width - n for n in tail_lengths], device=self.device)
        query = torch.arange(self.width, device=self.device)[:, None]
        key = torch.arange(self.width, device=self.device)[None, :]
        sees = ((key <= query) & (key >= pads[:, None, None])) | (key == query)
        self.tail_hidden = ~sees[:, None]
        self._tail_bias: Any = None

    def input_ids(self, tails: list[list[int]], pad_id: int) -> Any:
        import torch

        rows = [[pad_id] * (self.width - len(t)) + t for t in tails]
        return torch.tensor(rows, device=self.device)

    def positions(self) -> Any:
        """Each tail token's position in its prompt (padding gets position 0)."""
        import torch

        rows = [
            [0] * (self.width - n) + list(range(start, start + n))
            for start, n in zip(self.prefix_lengths, self.tail_lengths, strict=True)
        ]
        return torch.tensor(rows, device=self.device)

    def attend(self, layer: int, query: Any, key: Any, value: Any, scaling: float) -> Any:
        """[P, heads, width, d] queries over prefix and tail; returns [P, width, heads, d].
        The query heads that read one kv head are stacked ([P, kv_heads, groups * width, d])
        so no key is copied per head; prefix and tail are attended apart and merged."""

        self.tail_keys[layer], self.tail_values[layer] = key, value
        prompts, heads, width, head_dim = query.shape
        kv_heads = key.shape[1]
        groups = heads // kv_heads
        stacked = query.reshape(prompts, kv_heads, groups * width, head_dim)
        if self._tail_bias is None:  # the mask of every group's queries, made once
            hidden = self.tail_hidden.repeat(1, 1, groups, 1)
            self._tail_bias = attention_bias(hidden, query.dtype)
        output, lse = partial_attention(stacked, key, value, self._tail_bias, scaling)
        if self.prefix_keys[layer].shape[2]:
            prefix_out, prefix_lse = partial_attention(
                stacked,
                self.prefix_keys[layer],
                self.prefix_values[layer],
                self.prefix_bias,
                scaling,
            )
            prefix_lse = prefix_lse.masked_fill(self.no_prefix[:, None, None], float("-inf"))
            output = merge_partials(prefix_out, prefix_lse, output, lse, first_may_be_empty=True)
        return output.reshape(prompts, heads, width, head_dim).transpose(1, 2)

    def prompt_kv(self, index: int) -> list[LayerKV]:
        """The whole KV of prompt `index` (prefix and tail), [1, kv_heads, length, d] a layer."""
        import torch

        prefix, pad = self.prefix_lengths[index], self.width - self.tail_lengths[index]
        row = slice(index, index + 1)
        return [
            (
                torch.cat([pk[row, :, :prefix], tk[row, :, pad:]], dim=2),
                torch.cat([pv[row, :, :prefix], tv[row, :, pad:]], dim=2),
            )
            for pk, pv, tk, tv in zip(
                self.prefix_keys, self.prefix_values, self.tail_keys, self.tail_values, strict=True
            )
        ]
