"""DecodeBatch: the KV state of the sequences being decoded, each prompt's KV stored once.

The K samples of one prompt share its KV. A padded batch cache copies it into every row and
reads every copy at every step; with prompts of hundreds of tokens and completions of a hundred,
reading those copies is most of a large decode step on CPU (attention is bound by memory
bandwidth). Here each distinct prompt's KV is kept once, and each row only its own new tokens:

    prompt part   [P, kv_heads, prompt_width, head_dim]   one per distinct prompt (right-padded)
    own part      [B, kv_heads, capacity, head_dim]        one per sequence, written step by step

Sequences join (`add`) and leave (`keep`) at any step, so rows hold different numbers of own
tokens (`lengths`): the batch stays full while the work that feeds it arrives piecemeal (a
search tree asks for its critiques when its rewrites are tested). A step's attention scores every
row's query against its prompt (the queries of one prompt's rows go through one call) and
against its own tokens, merged into one softmax over both. The model's own modules compute
everything else (see `codeq.policy.attention`).
"""

from __future__ import annotations

from typing import Any

from codeq.policy.prefix_cache import LayerKV


class DecodeBatch:
    """Rows are sequences; `owners[row]` is the index of the row's prompt in `prompts`, and
    `capacity` the most own tokens any row will write."""

    def __init__(self, prompts: list[list[LayerKV]], owners: list[int], capacity: int):
        import torch

        first = prompts[0][0][0]
        self.device, self.dtype = first.device, first.dtype
        self.kv_heads, self.head_dim, self.layers = first.shape[1], first.shape[3], len(prompts[0])
        self.prompts: list[list[LayerKV]] = []
        self.owners = torch.zeros(0, dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)
        self.own_keys = [self._own_buffer(0, capacity) for _ in range(self.layers)]
        self.own_values = [self._own_buffer(0, capacity) for _ in range(self.layers)]
        self.add(prompts, owners, capacity)

    @property
    def rows(self) -> int:
        return len(self.owners)

    @property
    def capacity(self) -> int:
        return int(self.own_keys[0].shape[2])

    def add(self, prompts: list[list[LayerKV]], owners: list[int], capacity: int) -> None:
        """New rows after the current ones, with no own tokens yet: `owners` index `prompts`.
        Prompts no row reads any more are dropped now (the prompt part is rebuilt anyway)."""
        import torch

        used = sorted(set(self.owners.tolist()))
        kept = [self.prompts[i] for i in used] + prompts
        # Shortest prompt first, so that attention reads them in buckets of similar length
        # (`prompt_buckets`). `position` maps an index in `kept` to the prompt's new index.
        order = sorted(range(len(kept)), key=lambda i: kept[i][0][0].shape[2])
        position = torch.empty(len(kept), dtype=torch.long, device=self.device)
        position[order] = torch.arange(len(kept), device=self.device)
        renumber = torch.zeros(max(len(self.prompts), 1), dtype=torch.long, device=self.device)
        renumber[used] = position[: len(used)]
        old_owners = renumber[self.owners] if self.rows else self.owners
        new_owners = torch.tensor(owners, dtype=torch.long, device=self.device) + len(used)
        new_owners = position[new_owners]
        self.prompts = [kept[i] for i in order]
        self.prompt_keys, self.prompt_values, self.prompt_lengths, self.prompt_bias = stack_prompts(
            self.prompts
        )
        self.prompt_buckets = length_buckets(self.prompt_lengths.tolist())
        self._resize_own(self.rows + len(owners), max(capacity, self.capacity))
        self.lengths = torch.cat([self.lengths, torch.zeros_like(new_owners)])
        self._set_owners(torch.cat([old_owners, new_owners]))

    def positions(self) -> Any:
        """Position of each row's next token."""
        return self.prompt_lengths[self.owners] + self.lengths

    def keep(self, rows: Any) -> None:
        """Keep only these rows (finished sequences leave the batch). Only the own tokens
        written so far are copied."""
        self._resize_own(len(rows), self.capacity, keep=rows)
        self.lengths = self.lengths[rows]
        self._set_owners(self.owners[rows])

    def advance(self) -> None:
        """One token per row has been written by every layer."""
        self.lengths += 1

    def own_length(self, row: int) -> int:
        return int(self.lengths[row])

    def sequence_kv(self, row: int) -> list[LayerKV]:
        """Prompt and own KV of one row, as one [1, kv_heads, length, head_dim] per layer."""
        import torch

        owner, length = int(self.owners[row]), int(self.prompt_lengths[self.owners[row]])
        own = self.own_length(row)
        return [
            (
                torch.cat([pk[owner : owner + 1, :, :length], ok[row : row + 1, :, :own]], 2),
                torch.cat([pv[owner : owner + 1, :, :length], ov[row : row + 1, :, :own]], 2),
            )
            for pk, pv, ok, ov in zip(
                self.prompt_keys, self.prompt_values, self.own_keys, self.own_values, strict=True
            )
        ]

    def _resize_own(self, rows: int, capacity: int, keep: Any = None) -> None:
        """New own buffers of `rows` rows; the current rows (or those in the index `keep`)
        go first, with only the tokens written so far copied."""
        written = int(self.lengths.max()) if self.rows else 0
        for parts in (self.own_keys, self.own_values):
            for layer, old in enumerate(parts):
                kept = old[:, :, :written]
                if keep is not None:
                    kept = kept.index_select(0, keep)
                resized = self._own_buffer(rows, capacity)
                resized[: len(kept), :, :written] = kept
                parts[layer] = resized

    def _own_buffer(self, rows: int, capacity: int) -> Any:
        import torch

        shape = (rows, self.kv_heads, capacity, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _set_owners(self, owners: Any) -> None:
        """Rows are grouped by prompt into slots: slot = owner * group_width + rank. Also
        prepares the step: which own positions each row sees."""
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
        self.row_index = torch.arange(len(owners), device=self.device)
        # Rows in prompt order with every group full: slots are rows, no scatter needed.
        self.dense = prompts * self.group_width == len(owners) and bool(
            (self.slots == self.row_index).all()
        )

    def attend(self, layer: int, query: Any, key: Any, value: Any, scaling: float) -> Any:
        """Attention output [B, 1, heads, head_dim] of one decode step at `layer`; `key`/`value`
        ([B, kv_heads, 1, head_dim]) are this step's, written into the rows' own part first.
        The prompt part and the own part are attended separately and merged by their
        log-sum-exp, which is exactly one softmax over both."""

        if layer == 0:
            self._prepare_own_attention()
        own_keys, own_values = self.own_keys[layer], self.own_values[layer]
        self._write_own(own_keys, key)
        self._write_own(own_values, value)
        rows, heads, _, head_dim = query.shape
        kv_heads = own_keys.shape[1]
        groups = heads // kv_heads  # query head h reads kv head h // groups
        query = query.view(rows, kv_heads, groups, head_dim)
        # The prompts: one attention per prompt over all its rows' queries.
        prompt_out, prompt_lse = self._attend_prompts(layer, self._to_slots(query), scaling)
        prompt_out = self._from_slots(prompt_out, groups)
        prompt_lse = self._from_slots(prompt_lse[..., None], groups)[..., 0]
        own_out, own_lse = partial_attention(
            query,
            own_keys[:, :, : self._own_width],
            own_values[:, :, : self._own_width],
            self._own_bias,
            scaling,
        )
        output = merge_partials(prompt_out, prompt_lse, own_out, own_lse)
        return output.reshape(rows, 1, heads, head_dim)

    def _attend_prompts(self, layer: int, slotted: Any, scaling: float) -> tuple[Any, Any]:
        """Each bucket of similar-length prompts attended apart, each read only up to its
        longest prompt: a batch padded to its longest prompt reads the padding of every
        shorter one (measured in a search: a quarter more than the prompts' own length)."""
        import torch

        keys, values = self.prompt_keys[layer], self.prompt_values[layer]
        parts = [
            partial_attention(
                slotted[start:stop],
                keys[start:stop, :, :width],
                values[start:stop, :, :width],
                self.prompt_bias[start:stop, :, :, :width],
                scaling,
            )
            for start, stop, width in self.prompt_buckets
        ]
        if len(parts) == 1:
            return parts[0]
        return torch.cat([out for out, _ in parts]), torch.cat([lse for _, lse in parts])

    def _prepare_own_attention(self) -> None:
        """This step's own positions: where each row writes, and what it reads: up to the
        longest row's, a shorter row's later positions hidden (none when all are as long)."""
        import torch

        self._own_width = int(self.lengths.max()) + 1
        self._uniform = bool((self.lengths == self.lengths[0]).all())
        if self._uniform:
            self._own_bias = None
            return
        # Row r, kv head h writes at flat row (r * kv_heads + h) * capacity + lengths[r] of
        # the own buffer seen as [rows * kv_heads * capacity, head_dim]: one index_copy_.
        heads = torch.arange(self.kv_heads, device=self.device)
        starts = (self.row_index[:, None] * self.kv_heads + heads[None, :]) * self.capacity
        self._own_slots = (starts + self.lengths[:, None]).reshape(-1)
        positions = torch.arange(self._own_width, device=self.device)
        hidden = positions[None, :] > self.lengths[:, None]
        self._own_bias = attention_bias(hidden[:, None, None, :], self.dtype)

    def _write_own(self, buffer: Any, step: Any) -> None:
        """Write this step's keys or values ([B, kv_heads, 1, head_dim]) at each row's length."""
        if self._uniform:
            buffer[:, :, self._own_width - 1] = step[:, :, 0]
        else:
            flat = buffer.view(-1, self.head_dim)
            flat.index_copy_(0, self._own_slots, step.reshape(-1, self.head_dim))

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
    scores = float32_scores(query, keys) * scaling
    if bias is not None:
        scores = scores + bias
    lse = scores.logsumexp(dim=-1)
    weights = (scores - lse[..., None]).exp().to(values.dtype)
    return weights @ values, lse


def float32_scores(query: Any, keys: Any) -> Any:
    """query @ keys^T ([N, h, q, d] x [N, h, L, d] -> [N, h, q, L]) in fp32. A bf16 matmul
    rounds its output to bf16: 8 bits of mantissa, so a score of 60 comes out a multiple of
    0.25 and softmax weights off by up to a quarter (on SmolLM2 a greedy critique turned into
    '99.9999...'). CUDA's bmm writes fp32 from bf16 inputs (`out_dtype`); elsewhere, or with
    a torch without it, both sides are upcast (a copy of the keys)."""
    import torch

    if query.dtype == torch.float32:
        return query @ keys.transpose(-1, -2)
    n, heads, q, d = query.shape
    if query.device.type == "cuda":
        try:
            scores = torch.bmm(
                query.reshape(n * heads, q, d),
                keys.reshape(n * heads, -1, d).transpose(1, 2),
                out_dtype=torch.float32,
            )
            return scores.view(n, heads, q, -1)
        except (TypeError, RuntimeError):
            pass
    return query.float() @ keys.float().transpose(-1, -2)


def merge_partials(
    first: Any, first_lse: Any, second: Any, second_lse: Any, first_may_be_empty: bool = False
) -> Any:
    """Attention over the union of two sets of keys from the attention over each (outputs and
    log-sum-exps): the softmax over both, each part weighted by its share of the total,
    sigmoid(first_lse - second_lse) for the first. With `first_may_be_empty`, rows of the
    first part whose keys are all masked (log-sum-exp -inf, output undefined) weigh nothing;
    the second part must never be empty."""
    import torch

    share = torch.sigmoid(first_lse - second_lse)[..., None]
    first = first.float()
    if first_may_be_empty:
        first = torch.where(share > 0, first, 0.0)
    return torch.lerp(second.float(), first, share).to(second.dtype)


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


MAX_PADDING = 1.25  # padded / real tokens of one group of sequences padded to one length


def groups_by_length(lengths: list[int], max_tokens: int | None = None) -> list[list[int]]:
    """Indexes grouped by length, shortest first, so that a group's padded size stays within
    `MAX_PADDING` of its real tokens and within `max_tokens` (a longer one goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for index in order:
        if groups:
            padded = lengths[index] * (len(groups[-1]) + 1)
            real = sum(lengths[i] for i in groups[-1]) + lengths[index]
            fits = max_tokens is None or padded <= max_tokens
            if fits and padded <= MAX_PADDING * real:
                groups[-1].append(index)
                continue
        groups.append([index])
    return groups


def length_buckets(lengths: list[int]) -> list[tuple[int, int, int]]:
    """(start, stop, width) of the runs of `lengths` (ascending) that `groups_by_length`
    groups together; `width` is the run's longest."""
    return [(group[0], group[-1] + 1, lengths[group[-1]]) for group in groups_by_length(lengths)]


def attention_bias(hidden: Any, dtype: Any) -> Any:
    """Additive attention bias: -inf where `hidden`, else 0."""
    import torch

    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill(
        hidden, float("-inf")
    )


def _right_padded(tensors: list[Any], width: int) -> Any:
    """[1, heads, length, d] tensors stacked into one [n, heads, width, d], zeros after each
    one's length; each is copied once (padding each, then joining them, copied every prompt's
    KV twice at every admission)."""
    first = tensors[0]
    stacked = first.new_zeros(len(tensors), first.shape[1], width, first.shape[3])
    for row, tensor in enumerate(tensors):
        stacked[row, :, : tensor.shape[2]] = tensor[0]
    return stacked
