"""DecodeBatch: the KV state of the sequences being decoded, each prompt's KV stored once.

The K samples of one prompt share its KV. A padded batch cache copies it into every row and
reads every copy at every step; with prompts of hundreds of tokens and completions of a hundred,
reading those copies is most of a large decode step on CPU (attention is bound by memory
bandwidth). Here each distinct prompt's KV is kept once:

    prompt part   [P, kv_heads, width, head_dim]       one per distinct prompt (right-padded)
    own part      [rows, kv_heads, capacity, head_dim]  one per sample of a shared prompt

A prompt that one sequence reads alone (a critique, a batch of distinct prompts) is *private*:
its sequence writes its own tokens right after it in the prompt part, and its attention is one
fused call over both. The samples of a shared prompt write their own tokens apart: a step scores
their queries against the prompt (one call over all the prompt's rows) and against each row's
own tokens, merged by log-sum-exp into one softmax over both.

Sequences join (`add`) and leave (`keep`) at any step, so rows hold different numbers of own
tokens: the batch stays full while the work that feeds it arrives piecemeal (a search tree asks
for its critiques when its rewrites are tested). Nothing in a step reads the device back: the
host knows every row's length (all rows advance together), which decides every shape and branch.
A row that leaves moves only the rows that take its place; prompts no row reads any more are
skipped, and no buffer is reallocated until the batch outgrows it. The model's own modules
compute everything else (see `codeq.policy.attention`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from codeq.policy.prefix_cache import LayerKV


class DecodeBatch:
    """Rows are sequences; `host_owners[row]` is the index of the row's prompt in the prompt
    part, and `capacity` the most own tokens any row will write."""

    def __init__(self, prompts: list[list[LayerKV]], owners: list[int], capacity: int):
        import torch

        first = prompts[0][0][0]
        self.device, self.dtype = first.device, first.dtype
        self.kv_heads, self.head_dim, self.layers = first.shape[1], first.shape[3], len(prompts[0])
        self.capacity = 0
        empty = first.new_zeros(0, self.kv_heads, 0, self.head_dim)
        self.prompt_keys: list[Any] = [empty] * self.layers
        self.prompt_values: list[Any] = [empty] * self.layers
        self.prompt_sizes: list[int] = []  # tokens of each prompt
        self.private: list[bool] = []  # by prompt: one row reads it, its own tokens follow it
        self.host_owners: list[int] = []
        self.joined: list[int] = []  # by row: the step it joined at (own length: steps - joined)
        self.steps = 0
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)  # own tokens by row
        self.own_keys: list[Any] = [empty] * self.layers  # allocated once a prompt is shared
        self.own_values: list[Any] = [empty] * self.layers
        self.add(prompts, owners, capacity)

    @property
    def rows(self) -> int:
        return len(self.host_owners)

    def own_length(self, row: int) -> int:
        return self.steps - self.joined[row]

    def host_lengths(self) -> list[int]:
        return [self.steps - joined for joined in self.joined]

    def add(self, prompts: list[list[LayerKV]], owners: list[int], capacity: int) -> None:
        """New rows after the current ones, with no own tokens yet: `owners` index `prompts`,
        and a prompt only one of them reads is private. Prompts no row reads any more are
        dropped now (the prompt part is rebuilt anyway)."""
        import torch

        capacity = max(capacity, self.capacity)
        used = sorted(set(self.host_owners))
        lengths = self.host_lengths()
        row_of = {owner: row for row, owner in enumerate(self.host_owners)}
        # What each kept prompt holds in the prompt part: itself, and a private one its row's
        # own tokens.
        held = [self.prompt_sizes[p] + (lengths[row_of[p]] if self.private[p] else 0) for p in used]
        counts = Counter(owners)
        sizes = [self.prompt_sizes[p] for p in used] + [p[0][0].shape[2] for p in prompts]
        private = [self.private[p] for p in used] + [counts[i] == 1 for i in range(len(prompts))]
        # Shortest prompt first, so that attention reads them in buckets of similar length
        # (`prompt_buckets`). `position` maps an index in `sizes` to the prompt's new index.
        order = sorted(range(len(sizes)), key=lambda i: sizes[i])
        position = [0] * len(sizes)
        for new, old in enumerate(order):
            position[old] = new
        width = max(s + (capacity if p else 0) for s, p in zip(sizes, private, strict=True))
        kept_to = torch.tensor(position[: len(used)], dtype=torch.long, device=self.device)
        kept_from = torch.tensor(used, dtype=torch.long, device=self.device)
        for parts, which in ((self.prompt_keys, 0), (self.prompt_values, 1)):
            for layer in range(self.layers):
                stacked = self._zeros(len(sizes), width)
                if used:
                    kept = max(held)
                    stacked[kept_to, :, :kept] = parts[layer][kept_from, :, :kept]
                for index, prompt in enumerate(prompts, start=len(used)):
                    stacked[position[index], :, : sizes[index]] = prompt[layer][which][0]
                parts[layer] = stacked
        renumber = {p: position[u] for u, p in enumerate(used)}
        self.host_owners = [renumber[o] for o in self.host_owners]
        self.host_owners += [position[len(used) + o] for o in owners]
        self.joined += [self.steps] * len(owners)
        self.lengths = torch.cat([self.lengths, self.lengths.new_zeros(len(owners))])
        self.prompt_sizes = [sizes[i] for i in order]
        self.private = [private[i] for i in order]
        self.prompt_lengths = torch.tensor(self.prompt_sizes, device=self.device)
        self.prompt_buckets = length_buckets(self.prompt_sizes)
        padding = torch.arange(width, device=self.device) >= self.prompt_lengths[:, None]
        self._padding_bias = attention_bias(padding[:, None, None, :], self.dtype)
        self.capacity = capacity
        if not all(self.private[o] for o in self.host_owners):
            self._grow_own(lengths)
        self._layout()

    def positions(self) -> Any:
        """Position of each row's next token."""
        return self.prompt_lengths[self.owners] + self.lengths

    def keep(self, rows: Iterable[Any]) -> None:
        """Keep only these rows, in this order (finished sequences leave the batch). Only the
        own tokens of rows that change place are copied, within the same buffers."""
        import torch

        rows = [int(row) for row in rows]
        lengths = self.host_lengths()
        moved = [
            (new, old)
            for new, old in enumerate(rows)
            if new != old and not self.private[self.host_owners[old]]
        ]
        written = max((lengths[old] for _, old in moved), default=0)
        if written:
            to = torch.tensor([new for new, _ in moved], device=self.device)
            source = torch.tensor([old for _, old in moved], device=self.device)
            for buffer in (*self.own_keys, *self.own_values):
                buffer[to, :, :written] = buffer[source, :, :written]
        self.host_owners = [self.host_owners[row] for row in rows]
        self.joined = [self.joined[row] for row in rows]
        self.lengths = self.lengths[torch.tensor(rows, dtype=torch.long, device=self.device)]
        if rows:
            self._layout()

    def advance(self) -> None:
        """One token per row has been written by every layer."""
        self.steps += 1
        self.lengths += 1

    def sequence_kv(self, row: int) -> list[LayerKV]:
        """Prompt and own KV of one row, as one [1, kv_heads, length, head_dim] per layer (copies:
        the prefix cache keeps them)."""
        import torch

        owner, own = self.host_owners[row], self.own_length(row)
        size = self.prompt_sizes[owner]
        if self.private[owner]:
            return [
                (
                    pk[owner : owner + 1, :, : size + own].clone(),
                    pv[owner : owner + 1, :, : size + own].clone(),
                )
                for pk, pv in zip(self.prompt_keys, self.prompt_values, strict=True)
            ]
        return [
            (
                torch.cat([pk[owner : owner + 1, :, :size], ok[row : row + 1, :, :own]], 2),
                torch.cat([pv[owner : owner + 1, :, :size], ov[row : row + 1, :, :own]], 2),
            )
            for pk, pv, ok, ov in zip(
                self.prompt_keys, self.prompt_values, self.own_keys, self.own_values, strict=True
            )
        ]

    # -------------------------------------------------------------- layout (on changes)

    def _zeros(self, rows: int, width: int) -> Any:
        import torch

        shape = (rows, self.kv_heads, width, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _grow_own(self, lengths: list[int]) -> None:
        """Own buffers for every row and `capacity` tokens; reallocated (copying the tokens
        written so far, `lengths` by current row) only when they are too small."""
        allocated, room = self.own_keys[0].shape[0], self.own_keys[0].shape[2]
        if allocated >= self.rows and room >= self.capacity:
            return
        written = max(lengths, default=0) if allocated else 0
        for parts in (self.own_keys, self.own_values):
            for layer, old in enumerate(parts):
                grown = self._zeros(max(self.rows, allocated), self.capacity)
                if written:
                    grown[:allocated, :, :written] = old[:, :, :written]
                parts[layer] = grown

    def _layout(self) -> None:
        """Everything a step needs that changes only when rows join or leave: which prompts
        are read (runs of prompts some row reads, within one length bucket), where each row's
        queries go among them (slot = prompt * group_width + rank), which rows are private."""
        import torch

        live = set(self.host_owners)
        runs: list[tuple[int, int]] = []
        for start, stop, _ in self.prompt_buckets:
            begin = None
            for prompt in range(start, stop + 1):
                if prompt < stop and prompt in live:
                    begin = prompt if begin is None else begin
                elif begin is not None:
                    runs.append((begin, prompt))
                    begin = None
        compact: dict[int, int] = {}
        self.runs: list[tuple[int, int, int]] = []  # (first prompt, stop, first slot group)
        for begin, stop in runs:
            self.runs.append((begin, stop, len(compact)))
            for prompt in range(begin, stop):
                compact[prompt] = len(compact)
        self.attended = len(compact)
        self.group_width = max(Counter(self.host_owners).values())
        seen: Counter[int] = Counter()
        slots = []
        for owner in self.host_owners:
            slots.append(compact[owner] * self.group_width + seen[owner])
            seen[owner] += 1
        self.dense = self.attended * self.group_width == self.rows and slots == list(
            range(self.rows)
        )
        self.slots = torch.tensor(slots, device=self.device)
        self.owners = torch.tensor(self.host_owners, device=self.device)
        self.private_rows = [r for r, owner in enumerate(self.host_owners) if self.private[owner]]
        self.shared = len(self.private_rows) < self.rows
        self._private_row_of = {self.host_owners[r]: r for r in self.private_rows}
        if not self.private_rows:
            return
        index = torch.tensor(self.private_rows, device=self.device)
        owners = self.owners[index]
        heads = torch.arange(self.kv_heads, device=self.device)
        width = self.prompt_keys[0].shape[2]
        # Row r of private prompt p writes kv head h's token at flat row (p * kv_heads + h) *
        # width + size_p + length_r of the prompt part seen as [P * kv_heads * width, head_dim].
        self._private_base = (
            owners[:, None] * self.kv_heads + heads
        ) * width + self.prompt_lengths[owners][:, None]
        self._private_index = None if len(self.private_rows) == self.rows else index
        private_prompt = torch.zeros(len(self.prompt_sizes), dtype=torch.bool, device=self.device)
        private_prompt[owners] = True
        sole_row = torch.zeros(len(self.prompt_sizes), dtype=torch.long, device=self.device)
        sole_row[owners] = index
        self._private_prompt, self._sole_row = private_prompt, sole_row
        mask = torch.zeros(self.rows, dtype=torch.bool, device=self.device)
        mask[index] = True
        self._private_mask = mask[:, None, None, None]

    # -------------------------------------------------------------- one step

    def _prepare(self) -> None:
        """This step's positions, from the host's lengths: how far each run of prompts is read
        (a private prompt up to its row's token of this step) and what hides the rest; where
        each row writes its own token and what it reads of its own part."""
        import torch

        lengths = self.host_lengths()
        self._run_widths, self._run_masked = [], []
        for begin, stop, _ in self.runs:
            limits = [
                self.prompt_sizes[p]
                + (lengths[self._private_row_of[p]] + 1 if p in self._private_row_of else 0)
                for p in range(begin, stop)
            ]
            self._run_widths.append(max(limits))
            self._run_masked.append(min(limits) < max(limits))
        if self.private_rows:
            own = self.lengths if self._private_index is None else self.lengths[self._private_index]
            self._private_slots = (self._private_base + own[:, None]).reshape(-1)
            extra = torch.where(self._private_prompt, self.lengths[self._sole_row] + 1, 0)
            ends = self.prompt_lengths + extra
            positions = torch.arange(max(self._run_widths), device=self.device)
            self._prompt_bias = attention_bias(
                (positions >= ends[:, None])[:, None, None, :], self.dtype
            )
        else:
            self._prompt_bias = self._padding_bias
        if not self.shared:
            return
        self._own_width = max(lengths) + 1
        self._uniform = min(lengths) == max(lengths)
        if self._uniform:
            self._own_bias = None
            return
        # Row r, kv head h writes at flat row (r * kv_heads + h) * capacity + lengths[r] of
        # the own buffer seen as [rows * kv_heads * capacity, head_dim]: one index_copy_.
        room = self.own_keys[0].shape[2]
        heads = torch.arange(self.kv_heads, device=self.device)
        rows = torch.arange(self.rows, device=self.device)
        starts = (rows[:, None] * self.kv_heads + heads[None, :]) * room
        self._own_slots = (starts + self.lengths[:, None]).reshape(-1)
        positions = torch.arange(self._own_width, device=self.device)
        hidden = positions[None, :] > self.lengths[:, None]
        self._own_bias = attention_bias(hidden[:, None, None, :], self.dtype)

    def attend(self, layer: int, query: Any, key: Any, value: Any, scaling: float) -> Any:
        """Attention output [B, 1, heads, head_dim] of one decode step at `layer`; `key`/`value`
        ([B, kv_heads, 1, head_dim]) are this step's, written first (a private row's after its
        prompt, a shared prompt's row's into its own part). Rows of shared prompts attend the
        prompt and their own part apart, merged by log-sum-exp: exactly one softmax over both."""
        import torch

        if layer == 0:
            self._prepare()
        if self.private_rows:
            self._write_private(self.prompt_keys[layer], key)
            self._write_private(self.prompt_values[layer], value)
        rows, heads, _, head_dim = query.shape
        groups = heads // self.kv_heads  # query head h reads kv head h // groups
        query = query.view(rows, self.kv_heads, groups, head_dim)
        # The prompts: one attention per run of prompts over all their rows' queries.
        prompt_out, prompt_lse = self._attend_prompts(layer, self._to_slots(query), scaling)
        prompt_out = self._from_slots(prompt_out, groups)
        if not self.shared:
            return prompt_out.reshape(rows, 1, heads, head_dim)
        own_keys, own_values = self.own_keys[layer], self.own_values[layer]
        self._write_own(own_keys, key)
        self._write_own(own_values, value)
        prompt_lse = self._from_slots(prompt_lse[..., None], groups)[..., 0]
        own_out, own_lse = partial_attention(
            query,
            own_keys[:rows, :, : self._own_width],
            own_values[:rows, :, : self._own_width],
            self._own_bias,
            scaling,
        )
        output = merge_partials(prompt_out, prompt_lse, own_out, own_lse)
        if self.private_rows:  # private rows: the prompt part was everything
            output = torch.where(self._private_mask, prompt_out, output)
        return output.reshape(rows, 1, heads, head_dim)

    def _attend_prompts(self, layer: int, slotted: Any, scaling: float) -> tuple[Any, Any]:
        """Each run of similar-length prompts attended apart, each read only up to its longest
        prompt: a batch padded to its longest prompt reads the padding of every shorter one
        (measured in a search: a quarter more than the prompts' own length)."""
        import torch

        keys, values = self.prompt_keys[layer], self.prompt_values[layer]
        parts = [
            partial_attention(
                slotted[first : first + stop - begin],
                keys[begin:stop, :, :width],
                values[begin:stop, :, :width],
                self._prompt_bias[begin:stop, :, :, :width] if masked else None,
                scaling,
                need_lse=self.shared,
            )
            for (begin, stop, first), width, masked in zip(
                self.runs, self._run_widths, self._run_masked, strict=True
            )
        ]
        if len(parts) == 1:
            return parts[0]
        lse = torch.cat([lse for _, lse in parts]) if self.shared else None
        return torch.cat([out for out, _ in parts]), lse

    def _write_private(self, buffer: Any, step: Any) -> None:
        """This step's keys or values of the private rows, right after their prompts' tokens
        and the ones they wrote before."""
        if self._private_index is not None:
            step = step.index_select(0, self._private_index)
        buffer.view(-1, self.head_dim).index_copy_(
            0, self._private_slots, step.reshape(-1, self.head_dim)
        )

    def _write_own(self, buffer: Any, step: Any) -> None:
        """Write this step's keys or values ([B, kv_heads, 1, head_dim]) at each row's length."""
        if self._uniform:
            buffer[: self.rows, :, self._own_width - 1] = step[:, :, 0]
        else:
            flat = buffer.view(-1, self.head_dim)
            flat.index_copy_(0, self._own_slots, step.reshape(-1, self.head_dim))

    def _to_slots(self, per_row: Any) -> Any:
        """[B, kv_heads, groups, n] -> [attended, kv_heads, group_width * groups, n] (empty
        slots 0)."""
        rows, kv_heads, groups, n = per_row.shape
        if self.dense:
            slotted = per_row
        else:
            slotted = per_row.new_zeros(self.attended * self.group_width, kv_heads, groups, n)
            slotted.index_copy_(0, self.slots, per_row)
        slotted = slotted.view(self.attended, self.group_width, kv_heads, groups, n).transpose(1, 2)
        return slotted.reshape(self.attended, kv_heads, self.group_width * groups, n)

    def _from_slots(self, per_slot: Any, groups: int) -> Any:
        """Inverse of `_to_slots`: [attended, kv_heads, group_width * groups, n] -> [B, ...]."""
        prompts, kv_heads, _, n = per_slot.shape
        per_slot = per_slot.view(prompts, kv_heads, self.group_width, groups, n).transpose(1, 2)
        per_slot = per_slot.reshape(prompts * self.group_width, kv_heads, groups, n)
        return per_slot if self.dense else per_slot[self.slots]


def partial_attention(
    query: Any, keys: Any, values: Any, bias: Any, scaling: float, need_lse: bool = True
) -> Any:
    """(softmax(q k^T * scaling + bias) v, log-sum-exp of the scores) per query row; query
    [N, kv_heads, q, d], keys/values [N, kv_heads, length, d], bias [N, 1, 1, length] or None.
    On CPU PyTorch's fused kernel, which returns both (small batched bf16 matmuls cost 10-20 us
    each there; measured in a whole decode step at 16 rows, 15-20% faster than matmuls).
    Elsewhere the fused `scaled_dot_product_attention` where the log-sum-exp is not needed
    (`need_lse` False: it is returned as None), else plain matmuls with float32 scores."""
    if query.device.type == "cpu":
        return fused_cpu_attention(query, keys, values, bias, scaling)
    if not need_lse:
        return fused_attention(query, keys, values, bias, scaling), None
    return matmul_attention(query, keys, values, bias, scaling)


def fused_attention(query: Any, keys: Any, values: Any, bias: Any, scaling: float) -> Any:
    """The attention output alone, in one fused call (scores accumulate in float32 inside)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(query, keys, values, attn_mask=bias, scale=scaling)


def fused_cpu_attention(
    query: Any, keys: Any, values: Any, bias: Any, scaling: float, is_causal: bool = False
) -> Any:
    """PyTorch's fused CPU kernel: (output, log-sum-exp). Query heads may be a multiple of the
    kv heads (query head h reads kv head h // (heads / kv_heads)); `is_causal` (query i sees
    keys up to i) skips the blocks above the diagonal."""
    import torch

    output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, keys, values, is_causal=is_causal, attn_mask=bias, scale=scaling
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
