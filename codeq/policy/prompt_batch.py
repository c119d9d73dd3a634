"""PromptBatch: the uncached tails of several prompts read in one forward.

Each prompt may start with a prefix whose KV is already cached (see `PrefixCache`); only its
tail goes through the model. Reading tails one prompt at a time pays a fixed cost per forward
and runs matmuls over few rows; in one batch the tails are right-padded to one width, and each
prompt's logits are computed at its own last token only:

    prefix part  [P, kv_heads, prefix_width, head_dim]  cached, right-padded
    tail part    [P, kv_heads, tail_width, head_dim]    computed now, right-padded

Each query sees its prompt's prefix and the tail tokens up to itself. With the padding after
the tokens, causality alone hides it from every real token, so the tail is one fused causal
call (on CPU its kernel skips the blocks above the diagonal, and reads the query heads of one
kv head without copying the keys); a padding query sees real tokens, never an empty softmax.
"""

from __future__ import annotations

from typing import Any

from codeq.policy.decode_batch import (
    attention_bias,
    fused_cpu_attention,
    matmul_attention,
    merge_partials,
    partial_attention,
    stack_prompts,
)
from codeq.policy.prefix_cache import LayerKV


class PromptBatch:
    def __init__(self, prefixes: list[list[LayerKV]], tail_lengths: list[int]) -> None:
        self.device = prefixes[0][0][0].device
        self.prefix_keys, self.prefix_values, lengths, self.prefix_bias = stack_prompts(prefixes)
        self.prefix_lengths = lengths.tolist()
        self.no_prefix = lengths == 0
        self.tail_lengths = tail_lengths
        self.width = max(tail_lengths)
        self.tail_keys: list[Any] = [None] * len(self.prefix_keys)
        self.tail_values: list[Any] = [None] * len(self.prefix_keys)
        self._causal_bias: Any = None

    def input_ids(self, tails: list[list[int]], pad_id: int) -> Any:
        import torch

        rows = [t + [pad_id] * (self.width - len(t)) for t in tails]
        return torch.tensor(rows, device=self.device)

    def positions(self) -> Any:
        """Each tail token's position in its prompt (padding continues the count)."""
        import torch

        rows = [list(range(start, start + self.width)) for start in self.prefix_lengths]
        return torch.tensor(rows, device=self.device)

    def last_tokens(self) -> Any:
        """[P, 1]: the column of each prompt's last token, where its next-token logits are
        (the model's `logits_to_keep`)."""
        import torch

        return torch.tensor([[n - 1] for n in self.tail_lengths], device=self.device)

    def attend(self, layer: int, query: Any, key: Any, value: Any, scaling: float) -> Any:
        """[P, heads, width, d] queries over prefix and tail; returns [P, width, heads, d].
        Prefix and tail are attended apart and merged."""
        self.tail_keys[layer], self.tail_values[layer] = key, value
        prompts, heads, width, head_dim = query.shape
        kv_heads = key.shape[1]
        groups = heads // kv_heads
        # The query heads that read one kv head, stacked: [P, kv_heads, groups * width, d].
        stacked = query.reshape(prompts, kv_heads, groups * width, head_dim)
        output, lse = self._attend_tail(query, stacked, key, value, scaling)
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

    def _attend_tail(
        self, query: Any, stacked: Any, key: Any, value: Any, scaling: float
    ) -> tuple[Any, Any]:
        """Causal attention of the tail over itself, as ([P, kv_heads, groups * width, d],
        its log-sum-exp): on CPU one fused causal call with the query heads as they are;
        elsewhere matmuls over the stacked queries with a causal bias."""
        import torch

        prompts, kv_heads, rows, head_dim = stacked.shape
        if query.device.type == "cpu":
            output, lse = fused_cpu_attention(query, key, value, None, scaling, is_causal=True)
            return output.reshape(stacked.shape), lse.reshape(prompts, kv_heads, rows)
        if self._causal_bias is None:  # the mask of every group's queries, made once
            width = query.shape[2]
            positions = torch.arange(width, device=self.device)
            hidden = positions[None, :] > positions[:, None]
            self._causal_bias = attention_bias(
                hidden.repeat(rows // width, 1)[None, None], query.dtype
            )
        return matmul_attention(stacked, key, value, self._causal_bias, scaling)

    def prompt_kv(self, index: int) -> list[LayerKV]:
        """The whole KV of prompt `index` (prefix and tail), [1, kv_heads, length, d] a layer."""
        import torch

        prefix, tail = self.prefix_lengths[index], self.tail_lengths[index]
        row = slice(index, index + 1)
        return [
            (
                torch.cat([pk[row, :, :prefix], tk[row, :, :tail]], dim=2),
                torch.cat([pv[row, :, :prefix], tv[row, :, :tail]], dim=2),
            )
            for pk, pv, tk, tv in zip(
                self.prefix_keys, self.prefix_values, self.tail_keys, self.tail_values, strict=True
            )
        ]
