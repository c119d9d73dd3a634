"""The pieces of the decode loop on their own: shared-prompt attention, the prefix cache, sampling."""

from __future__ import annotations

import pytest
import torch

from codeq.policy.decode_batch import (
    DecodeBatch,
    fused_cpu_attention,
    length_buckets,
    matmul_attention,
    merge_partials,
)
from codeq.policy.prefix_cache import PrefixCache
from codeq.policy.sampling import CANDIDATES, sample_tokens
from codeq.policy.stream import fill_holes

KV_HEADS, GROUPS, HEAD_DIM, LAYERS = 2, 3, 16, 2


def random_prompt(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [
        (torch.randn(1, KV_HEADS, length, HEAD_DIM), torch.randn(1, KV_HEADS, length, HEAD_DIM))
        for _ in range(LAYERS)
    ]


def reference_attention(query, keys, values, scaling):
    """Plain softmax attention of one row's queries [heads, d] over its whole KV [kv, L, d]."""
    keys = keys.repeat_interleave(GROUPS, dim=0)
    values = values.repeat_interleave(GROUPS, dim=0)
    weights = (query[:, None, :] @ keys.transpose(-1, -2) * scaling).softmax(dim=-1)
    return (weights @ values)[:, 0]


@pytest.mark.parametrize("kernel", [fused_cpu_attention, matmul_attention])
def test_partial_attention_returns_output_and_log_sum_exp(kernel):
    query = torch.randn(3, KV_HEADS, 4, HEAD_DIM)
    keys, values = torch.randn(3, KV_HEADS, 9, HEAD_DIM), torch.randn(3, KV_HEADS, 9, HEAD_DIM)
    bias = torch.zeros(3, 1, 1, 9)
    bias[0, ..., 6:] = float("-inf")  # a padded prompt
    output, lse = kernel(query, keys, values, bias, 0.25)
    scores = query @ keys.transpose(-1, -2) * 0.25 + bias
    expected = scores.softmax(dim=-1) @ values
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, scores.logsumexp(dim=-1), rtol=1e-4, atol=1e-5)


def test_matmul_attention_keeps_bf16_scores_in_float32():
    """Scores of bf16 queries and keys are not rounded to bf16: with scores in the hundreds a
    bf16 matmul's output is off by whole units, which moves softmax weights by e^1 and more."""
    torch.manual_seed(0)
    query = (torch.randn(2, KV_HEADS, 3, 64) * 4).bfloat16()
    keys = (torch.randn(2, KV_HEADS, 50, 64) * 4).bfloat16()
    values = torch.randn(2, KV_HEADS, 50, 64).bfloat16()
    output, lse = matmul_attention(query, keys, values, None, 1.0)
    exact = query.float() @ keys.float().transpose(-1, -2)
    torch.testing.assert_close(lse, exact.logsumexp(dim=-1), rtol=1e-6, atol=1e-3)
    expected = exact.softmax(dim=-1) @ values.float()
    torch.testing.assert_close(output.float(), expected, rtol=2e-2, atol=2e-2)
    rounded = (query @ keys.transpose(-1, -2)).float()  # what a bf16 matmul hands back
    assert float((rounded.logsumexp(dim=-1) - exact.logsumexp(dim=-1)).abs().max()) > 0.05


def test_merging_two_partial_attentions_equals_attention_over_both():
    torch.manual_seed(0)
    query = torch.randn(3, KV_HEADS, 4, HEAD_DIM)
    keys, values = torch.randn(3, KV_HEADS, 9, HEAD_DIM), torch.randn(3, KV_HEADS, 9, HEAD_DIM)
    first = matmul_attention(query, keys[:, :, :5], values[:, :, :5], None, 0.25)
    second = matmul_attention(query, keys[:, :, 5:], values[:, :, 5:], None, 0.25)
    merged = merge_partials(*first, *second)
    expected = (query @ keys.transpose(-1, -2) * 0.25).softmax(dim=-1) @ values
    torch.testing.assert_close(merged, expected, rtol=1e-5, atol=1e-5)
    # a first part with every key masked weighs nothing, even where its output is undefined
    empty = torch.full_like(first[0], float("nan")), torch.full_like(first[1], float("-inf"))
    alone = merge_partials(*empty, *second, first_may_be_empty=True)
    torch.testing.assert_close(alone, second[0])


@pytest.mark.parametrize(
    ("owners", "keep", "joining"),
    [
        # uneven groups (2, 1 and 3 samples): one prompt keeps one row of two, one loses one;
        # then two samples of a new prompt and one of prompt 1 again join
        ([0, 0, 1, 2, 2, 2], [0, 2, 4, 5], [0, 0, 1]),
        # every prompt read by one row (private: its own tokens follow it in the prompt part)
        ([0, 1, 2], [1, 2], [0, 1]),
        # the same, with a row leaving from the middle
        ([2, 0, 1], [0, 2], [1]),
        # rows that leave below the new end are filled from past it (as the stream keeps them)
        ([0, 0, 1, 2, 2, 2], fill_holes([0, 2, 4, 5], 6), [0, 0, 1]),
    ],
)
def test_batch_attention_equals_attention_over_each_rows_whole_sequence(owners, keep, joining):
    """Rows leave (step 2) and join (step 3), so rows hold different numbers of own tokens;
    every output equals plain attention over the row's prompt and own tokens. A leaving row
    reallocates nothing, and prompts no row reads any more are not attended."""
    torch.manual_seed(0)
    prompts = [random_prompt(length) for length in (5, 9, 7)]
    batch = DecodeBatch(prompts, owners, capacity=6)
    prompt_of = {row: prompts[owner] for row, owner in enumerate(owners)}
    # Each row's own keys and values, recorded here independently of the batch.
    own = {row: [([], []) for _ in range(LAYERS)] for row in range(len(owners))}
    rows = list(range(len(owners)))
    for step in range(5):
        if step == 2:
            buffers = [buffer.data_ptr() for buffer in (*batch.own_keys, *batch.own_values)]
            batch.keep(torch.tensor(keep))
            rows = [rows[i] for i in keep]
            assert buffers == [b.data_ptr() for b in (*batch.own_keys, *batch.own_values)]
            assert batch.attended == len({owners[row] for row in rows})
        if step == 3:  # a new prompt, and prompt 1 again
            new = [random_prompt(4), prompts[1]]
            for row, owner in enumerate(joining, start=len(owners)):
                prompt_of[row] = new[owner]
                own[row] = [([], []) for _ in range(LAYERS)]
                rows.append(row)
            batch.add(new[: max(joining) + 1], joining, capacity=8)
        for layer in range(LAYERS):
            query = torch.randn(len(rows), KV_HEADS * GROUPS, 1, HEAD_DIM)
            key = torch.randn(len(rows), KV_HEADS, 1, HEAD_DIM)
            value = torch.randn(len(rows), KV_HEADS, 1, HEAD_DIM)
            output = batch.attend(layer, query, key, value, scaling=0.25)
            assert output.shape == (len(rows), 1, KV_HEADS * GROUPS, HEAD_DIM)
            for index, row in enumerate(rows):
                own[row][layer][0].append(key[index])
                own[row][layer][1].append(value[index])
                prompt_keys, prompt_values = prompt_of[row][layer]
                keys = torch.cat([prompt_keys[0], *own[row][layer][0]], dim=1)
                values = torch.cat([prompt_values[0], *own[row][layer][1]], dim=1)
                expected = reference_attention(query[index, :, 0], keys, values, 0.25)
                torch.testing.assert_close(output[index, 0], expected, rtol=1e-4, atol=1e-5)
        batch.advance()
    whole = [prompt_of[row][0][0].shape[2] + len(own[row][0][0]) for row in rows]
    assert batch.positions().tolist() == whole
    # a row's whole KV: its prompt, then its own tokens in order
    for index, row in enumerate(rows):
        [(keys, _), _] = batch.sequence_kv(index)
        expected = torch.cat([prompt_of[row][0][0][0], *own[row][0][0]], dim=1)
        torch.testing.assert_close(keys[0], expected)


def test_prompts_are_attended_in_buckets_of_similar_length():
    assert length_buckets([4, 5, 7, 9]) == [(0, 2, 5), (2, 4, 9)]
    assert length_buckets([300, 310, 320]) == [(0, 3, 320)]
    assert length_buckets([100, 400, 900]) == [(0, 1, 100), (1, 2, 400), (2, 3, 900)]
    # the batch keeps its prompts shortest first, so each bucket is one run of them
    batch = DecodeBatch([random_prompt(9), random_prompt(4), random_prompt(5)], [0, 1, 2], 2)
    assert batch.prompt_lengths.tolist() == [4, 5, 9]
    assert batch.prompt_buckets == [(0, 2, 5), (2, 3, 9)]


def test_sequence_kv_joins_the_prompt_and_the_rows_own_tokens():
    prompts = [random_prompt(4), random_prompt(6)]
    batch = DecodeBatch(prompts, [1, 0], capacity=3)
    for layer in range(LAYERS):
        step = torch.full((2, KV_HEADS, 1, HEAD_DIM), 7.0)
        batch.attend(layer, torch.randn(2, KV_HEADS * GROUPS, 1, HEAD_DIM), step, step, 0.25)
    batch.advance()
    keys, values = batch.sequence_kv(0)[1]
    assert keys.shape == (1, KV_HEADS, 6 + 1, HEAD_DIM)
    torch.testing.assert_close(keys[:, :, :6], prompts[1][1][0])
    assert bool((values[:, :, 6] == 7.0).all())


def layers_of(length: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, 1, length, 2), fill), torch.full((1, 1, length, 2), fill))]


def test_prefix_cache_finds_the_longest_common_prefix_with_any_kept_sequence():
    cache = PrefixCache(max_tokens=100)
    cache.add([1, 2, 3, 4, 5, 6], layers_of(6, 1.0))
    cache.add([1, 2, 9], layers_of(3, 2.0))
    reused, kv = cache.longest_prefix([1, 2, 3, 4, 7, 7, 7])  # diverges inside the first one
    assert reused == 4 and kv[0][0].shape[2] == 4
    assert float(kv[0][0][0, 0, 0, 0]) == 1.0
    # A prompt equal to a kept sequence still reads its last token (its logits are needed).
    assert cache.longest_prefix([1, 2, 9])[0] == 2
    assert cache.longest_prefix([5, 5]) == (0, None)


def test_prefix_cache_keeps_one_copy_of_nested_sequences_and_its_token_budget():
    cache = PrefixCache(max_tokens=10)
    cache.add([1, 2, 3], layers_of(3, 1.0))
    cache.add([1, 2, 3, 4, 5], layers_of(5, 1.0))  # extends the first: replaces it
    cache.add([1, 2], layers_of(2, 1.0))  # covered by the second: not stored again
    assert list(cache.entries) == [(1, 2, 3, 4, 5)] and cache.tokens == 5
    cache.add([7, 8, 9, 10], layers_of(4, 1.0))
    cache.longest_prefix([1, 2, 3, 0])  # touch: the first is now most recently used
    cache.add([20, 21, 22], layers_of(3, 1.0))  # over budget: the least recently used goes
    assert list(cache.entries) == [(1, 2, 3, 4, 5), (20, 21, 22)] and cache.tokens == 8
    cache.add(list(range(11)), layers_of(11, 1.0))  # longer than the whole budget
    assert cache.tokens == 8


def test_nucleus_sampling_draws_from_the_nucleus_in_proportion():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).repeat(40_000, 1)
    probabilities = (logits[0] / 0.8).softmax(dim=-1)
    drawn = sample_tokens(logits, temperature=0.8, top_p=0.9)
    # Tokens stay while the probability before them is at most top_p: here the first three.
    size = int(((probabilities.cumsum(0) - probabilities) <= 0.9).sum())
    assert size == 3
    nucleus = probabilities[:size] / probabilities[:size].sum()
    frequencies = torch.bincount(drawn, minlength=6).float() / len(drawn)
    torch.testing.assert_close(frequencies[:size], nucleus, atol=0.01, rtol=0)
    assert frequencies[size:].sum() == 0
    full = sample_tokens(logits, temperature=0.8, top_p=1.0)
    frequencies = torch.bincount(full, minlength=6).float() / len(full)
    torch.testing.assert_close(frequencies, probabilities, atol=0.01, rtol=0)
    assert sample_tokens(logits[:3], temperature=0.0, top_p=0.9).tolist() == [0, 0, 0]


def test_sampling_falls_back_to_a_full_sort_when_the_candidates_miss_the_nucleus():
    torch.manual_seed(0)
    vocab = 4 * CANDIDATES
    flat = torch.zeros(2000, vocab)  # uniform: the candidates hold a quarter of the mass
    peaked = torch.full((2000, vocab), -30.0)
    peaked[:, 3] = 0.0
    drawn = sample_tokens(torch.cat([flat, peaked]), temperature=1.0, top_p=0.5)
    uniform, certain = drawn[:2000], drawn[2000:]
    assert bool((certain == 3).all())
    # Half the vocabulary is in the nucleus of a uniform row, beyond the candidates.
    assert int(uniform.max()) >= CANDIDATES and len(set(uniform.tolist())) > CANDIDATES


def test_sampling_without_host_branches_draws_the_same_tokens():
    """A GPU step samples without reading back which rows need a full sort: every row is also
    drawn from its full sort and the draw picked on the device. Same tokens, same uniforms."""
    torch.manual_seed(0)
    vocab = 4 * CANDIDATES
    flat = torch.zeros(50, vocab)  # the candidates miss the nucleus: the full sort decides
    peaked = torch.randn(50, vocab) * 4  # the candidates hold it
    logits = torch.cat([flat, peaked])[torch.randperm(100)]
    uniforms = torch.rand(100, 1)
    branched = sample_tokens(logits, 0.9, 0.5, uniforms, branches=True)
    assert torch.equal(sample_tokens(logits, 0.9, 0.5, uniforms, branches=False), branched)
    assert int(branched.max()) >= CANDIDATES  # some rows came from beyond the candidates


def test_leaving_rows_are_filled_from_the_end_so_few_rows_move():
    assert fill_holes([0, 2, 4, 5], 6) == [0, 4, 2, 5]
    assert fill_holes([1, 2, 3], 4) == [3, 1, 2]
    assert fill_holes([0, 1], 4) == [0, 1]
    assert fill_holes([5], 6) == [5]
