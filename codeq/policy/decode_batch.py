"""DecodeBatch: the KV state of one batch of sequences being decoded, prompts stored once.

The K samples of one prompt share its KV. A padded batch cache copies it into every row and
reads every copy at every step; with prompts of hundreds of tokens and completions of a hundred,
reading those copies is most of a large decode step on CPU (attention is bound by memory
bandwidth). Here each distinct prompt's KV is kept once, and each row only its own new tokens:

    prompt part   [P, kv_heads, prompt_width, head_dim]   one per distinct prompt (right-padded)
    own part      [B, kv_heads, max_new_tokens, head_dim]  one per sequence, written step by step

A step's attention scores every row's query against its prompt (the queries of one prompt's
rows go through one matmul) and against its own tokens, with one softmax over both. The model's
own modules compute everything else (see `codeq.policy.attention`).
"""

from __future__ import annotations

from typing import Any

from codeq.policy.prefix_cache import LayerKV


class DecodeBatch:
    """Rows are sequences; `owners[row]` is the index of the row's prompt in `prompts`."""

    def __init__(self, prompts: list[list[LayerKV]], owners: list[int], max_new_tokens: int):
        import torch

        first = prompts[0][0][0]
        self.device = first.device
        self.prompt_keys, self.prompt_values, self.prompt_lengths, self.prompt_bias = stack_prompts(
            prompts
        )
        rows, kv_heads, head_dim = len(owners), first.shape[1], first.shape[3]
        shape = (rows, kv_heads, max_new_tokens, head_dim)
        self.own_keys = [
            torch.empty(shape, dtype=first.dtype, device=self.device) for _ in prompts[0]
        ]
        self.own_values = [torch.empty_like(k) for k in self.own_keys]
        self.length = 0  # own tokens written per row (all rows started together)
        self._set_owners(torch.tensor(owners, device=self.device))

    def positions(self) -> Any:
        """Position of each row's next token."""
        return self.prompt_lengths[self.owners] + self.length

    def keep(self, rows: Any) -> None:
        """Keep only these rows (finished sequences leave the batch)."""
        self.own_keys = [k.index_select(0, rows) for k in self.own_keys]
        self.own_values = [v.index_select(0, rows) for v in self.own_values]
        self._set_owners(self.owners[rows])

    def advance(self) -> None:
        """One token per row has been written by every layer."""
        self.length += 1

    def sequence_kv(self, row: int) -> list[LayerKV]:
        """Prompt and own KV of one row, as one [1, kv_heads, length, head_dim] per layer."""
        import torch

        owner, length = int(self.owners[row]), int(self.prompt_lengths[self.owners[row]])
        return [
            (
                torch.cat(
                    [pk[owner : owner + 1, :, :length], ok[row : row + 1, :, : self.length]], 2
                ),
                torch.cat(
                    [pv[owner : owner + 1, :, :length], ov[row : row + 1, :, : self.length]], 2
                ),
            )
            for pk, pv, ok, ov in zip(
                self.prompt_keys, self.prompt_values, self.own_keys, self.own_values, strict=True
            )
        ]

    def _set_owners(self, owners: Any) -> None:
        """Rows are grouped by prompt into slots: slot = owner * group_width + rank."""
        import torch

        self.owners = owners
        prompts = len(self.prompt_lengths)
        counts = torch.bincount(owners, minlength=prompts)
        self.group_width = int(counts.max())
        order = torch.argsort(owners, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(owners)
        rank[order] = torch.arange(len(owners), device=self.device) - starts[owners[order]]
        self.slots = owners * self.group_width + rank
        # Rows in prompt order with every group full: slots are rows, no scatter needed.
        self.dense = prompts * self.group_width == len(owners) and bool(
            (self.slots == torch.arange(len(owners), device=self.device)).all()
        )

    def attend(self, layer: int, query: Any, key: Any, value: Any, scaling: float) -> Any:
        """Attention output [B, 1, heads, head_dim] of one decode step at `layer`; `key`/`value`
        ([B, kv_heads, 1, head_dim]) are this step's, written into the rows' own part first.
        The prompt part and the own part are attended separately and merged by their
        log-sum-exp, which is exactly one softmax over both."""

        own_keys, own_values = self.own_keys[layer], self.own_values[layer]
        own_keys[:, :, self.length] = key[:, :, 0]
        own_values[:, :, self.length] = value[:, :, 0]
        rows, heads, _, head_dim = query.shape
        kv_heads = own_keys.shape[1]
        groups = heads // kv_heads  # query head h reads kv head h // groups
        query = query.view(rows, kv_heads, groups, head_dim)
        # The prompts: one attention per prompt over all its rows' queries.
        prompt_out, prompt_lse = partial_attention(
            self._to_slots(query),
            self.prompt_keys[layer],
            self.prompt_values[layer],
            self.prompt_bias,
            scaling,
        )
        prompt_out = self._from_slots(prompt_out, groups)
        prompt_lse = self._from_slots(prompt_lse[..., None], groups)[..., 0]
        own_out, own_lse = partial_attention(
            query,
            own_keys[:, :, : self.length + 1],
            own_values[:, :, : self.length + 1],
            None,
            scaling,
        )
        output = merge_partials(prompt_out, prompt_lse, own_out, own_lse)
        return output.reshape(rows, 1, heads, head_dim)

    def _to_slots(self, per_row: Any) -> Any:
        """[B, kv_heads, groups, n] -> [P, kv_heads, group_width * groups, n] (empty slots 0)."""
        rows, kv_heads, groups, n = per_row.shape
        prompts = len(self.prompt_lengths)
        if self.dense:
            slotted = per_row
        else:
            slotted = per_row.new_zeros(prompts * self.group_width, kv_heads, groups, n)
            slotted.index_copy_(0, self.slots, per_row)
        slotted = slotted.view(prompts, self.group_width, kv_heads, groups, n).transpose(1, 2)
        return slotted.reshape(prompts, kv_heads, self.group_width * groups, n)

    def _from_slots(self, per_slot: Any, groups: int) -> Any:
        """Inverse of `_to_slots`: [P, kv_heads, group_width * groups, n] -> [B, ...]."""
        prompts, kv_heads, _, n = per_slot.shape
        per_slot = per_slot.view(prompts, kv_heads, self.group_width, groups, n).transpose(1, 2)
        per_slot = per_slot.reshape(prompts * self.group_width, kv_heads, groups, n)
        return per_slot if self.dense else per_slot[self.slots]


def partial_attention(query: Any, keys: Any, values: Any, bias: Any, scaling: float) -> Any:
    """(softmax(q k^T * scaling + bias) v, log-sum-exp of the scores) per query row; query
    [N, kv_heads, q, d], keys/values [N, kv_heads, length, d], bias [N, 1, 1, length] or None.
    On CPU PyTorch's fused kernel (small batched bf16 matmuls cost 10-20 us each there; measured
    in a whole decode step at 16 rows, 15-20% faster than matmuls), elsewhere plain matmuls."""
    if query.device.type == "cpu":
        return fused_cpu_attention(query, keys, values, bias, scaling)
    return matmul_attention(query, keys, values, bias, scaling)


def fused_cpu_attention(query: Any, keys: Any, values: Any, bias: Any, scaling: float) -> Any:
    import torch

    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, keys, values, attn_mask=bias, scale=scaling
    )
    return output, lse


def matmul_attention(query: Any, keys: Any, values: Any, bias: Any, scaling: float) -> Any:
    scores = (query @ keys.transpose(-1, -2)).float() * scaling
    if bias is not None:
        scores = scores + bias
    lse = scores.logsumexp(dim=-1)
    weights = (scores - lse[..., None]).exp().to(values.dtype)
    return weights @ values, lse


def merge_partials(first: Any, first_lse: Any, second: Any, second_lse: Any) -> Any:
    """Attention over the union of two sets of keys from the attention over each (outputs and
    log-sum-exps): the softmax over both, weighted by each part's share. A part whose keys are
    all masked must come with log-sum-exp -inf (it then weighs nothing)."""
    import torch

    total = torch.logaddexp(first_lse, second_lse)
    first_weight = (first_lse - total).exp()[..., None]
    output = torch.where(first_weight > 0, first.float() * first_weight, 0.0)
    output += second.float() * (second_lse - total).exp()[..., None]
    return output.to(second.dtype)


def stack_prompts(prompts: list[list[LayerKV]]) -> tuple[list[Any], list[Any], Any, Any]:
    """The prompts' KV as one batch: per layer their keys and values right-padded to the
    longest ([P, kv_heads, width, head_dim]), their lengths ([P]), and the bias that hides the
    padding ([P, 1, 1, width]: 0 on a prompt's tokens, -inf after them)."""
    import torch

    first = prompts[0][0][0]
    lengths = torch.tensor([p[0][0].shape[2] for p in prompts], device=first.device)
    width = int(lengths.max())
    keys = [
        _right_padded([p[layer][0] for p in prompts], width) for layer in range(len(prompts[0]))
    ]
    values = [
        _right_padded([p[layer][1] for p in prompts], width) for layer in range(len(prompts[0]))
    ]
    padding = torch.arange(width, device=first.device) >= lengths[:, None]
    return keys, values, lengths, attention_bias(padding[:, None, None, :], first.dtype)


def attention_bias(hidden: Any, dtype: Any) -> Any:
    """Additive attention bias: -inf where `hidden`, else 0."""
    import torch

    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill(
        hidden, float("-inf")
    )


def _right_padded(tensors: list[Any], width: int) -> Any:
    import torch

    return torch.cat(
        [torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])) for t in tensors], dim=0
    )
