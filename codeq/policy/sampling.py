"""Choosing the next token of every live sequence from its logits: greedy, or nucleus sampling.

The obvious way (sort the whole vocabulary, softmax, cumsum, `torch.multinomial`) cost ~40 ms a
step at batch 16 on a 49k vocabulary on CPU: a quarter of the decode step of a 135M model. Here
the nucleus is looked for among the `CANDIDATES` most likely tokens first, which is exact whenever
they hold more than `top_p` of the probability (nearly always; rows where they do not are sorted
in full), and a token is drawn by inverting the cumulative distribution with one uniform number.
"""

from __future__ import annotations

from typing import Any

CANDIDATES = 256  # tokens looked at before falling back to a full sort for a row


def sample_tokens(
    logits: Any,
    temperature: float,
    top_p: float,
    uniforms: Any | None = None,
    branches: bool | None = None,
) -> Any:
    """One token id per row of `logits` (batch x vocab): the argmax at temperature 0, else a
    draw from softmax(logits / temperature) restricted to the nucleus: the most likely tokens
    whose probability before them is at most `top_p` (the most likely token always stays).
    `uniforms` (rows x 1, in [0, 1)) are the random numbers of the draws; by default torch's
    global generator makes them (on the logits' device). `branches` (default: on CPU) sorts
    in full only the rows whose candidates miss the nucleus, which needs their number on the
    host; without, every row is also drawn from its full sort and the draw picked per row on
    the device (the same tokens: no read back, as a GPU step wants)."""
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    if uniforms is None:
        uniforms = torch.rand(logits.shape[0], 1, device=logits.device)
    scaled = logits.float() / temperature
    if top_p >= 1.0:
        return _draw(scaled.softmax(dim=-1), uniforms).squeeze(-1)
    k = min(CANDIDATES, scaled.shape[-1])
    top_logits, top_ids = scaled.topk(k, dim=-1)
    top_probabilities = (top_logits - scaled.logsumexp(dim=-1, keepdim=True)).exp()
    covered = top_probabilities.sum(dim=-1) > top_p  # the nucleus lies within the candidates
    if branches is None:
        branches = logits.device.type == "cpu"
    if not branches:
        from_candidates = _draw_nucleus(top_probabilities, top_ids, top_p, uniforms)
        full_logits, full_ids = scaled.sort(dim=-1, descending=True)
        from_all = _draw_nucleus(full_logits.softmax(dim=-1), full_ids, top_p, uniforms)
        return torch.where(covered, from_candidates, from_all)
    chosen = torch.empty(scaled.shape[0], dtype=torch.long, device=scaled.device)
    rows = covered.nonzero().squeeze(-1)
    if len(rows):
        chosen[rows] = _draw_nucleus(top_probabilities[rows], top_ids[rows], top_p, uniforms[rows])
    rows = (~covered).nonzero().squeeze(-1)
    if len(rows):
        full_logits, full_ids = scaled[rows].sort(dim=-1, descending=True)
        chosen[rows] = _draw_nucleus(full_logits.softmax(dim=-1), full_ids, top_p, uniforms[rows])
    return chosen


def _draw_nucleus(sorted_probabilities: Any, ids: Any, top_p: float, uniforms: Any) -> Any:
    """Per row, one of `ids` (most likely first) from the nucleus of `sorted_probabilities`."""
    before = sorted_probabilities.cumsum(dim=-1) - sorted_probabilities
    nucleus = sorted_probabilities.masked_fill(before > top_p, 0.0)
    return ids.gather(-1, _draw(nucleus, uniforms)).squeeze(-1)


def _draw(weights: Any, uniforms: Any) -> Any:
    """Per row, a column drawn with probability proportional to `weights[row]` (rows x 1),
    by inverting the cumulative weights at `uniforms[row]`."""
    import torch

    cumulative = weights.cumsum(dim=-1)
    targets = uniforms.to(cumulative.dtype) * cumulative[:, -1:]
    columns = torch.searchsorted(cumulative, targets, right=True)
    return columns.clamp_(max=weights.shape[-1] - 1)


def sample_rows(logits: Any, temperatures: list[float], top_ps: list[float], uniforms: Any) -> Any:
    """One token per row, each row with its own temperature and top-p: the rows of each
    distinct (temperature, top-p) go through `sample_tokens` together, so a row draws exactly
    as the engine's stream draws it from the same logits and uniform. Host-side grouping:
    not for a captured CUDA graph (see `sample_rows_static`)."""
    import torch

    groups: dict[tuple[float, float], list[int]] = {}
    for row, key in enumerate(zip(temperatures, top_ps, strict=True)):
        groups.setdefault(key, []).append(row)
    if len(groups) == 1:
        [(temperature, top_p)] = groups
        return sample_tokens(logits, temperature, top_p, uniforms)
    chosen = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for (temperature, top_p), rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        chosen[index] = sample_tokens(logits[index], temperature, top_p, uniforms[index])
    return chosen


def sample_rows_static(logits: Any, temperatures: Any, top_ps: Any, uniforms: Any) -> Any:
    """`sample_rows` with the settings as tensors and no branch on their values (what a
    captured CUDA graph replays): greedy where the temperature is 0, else a draw from the
    nucleus of the whole sorted vocabulary. The distribution is `sample_tokens`'s; the token
    a uniform maps to can differ at top-p 1, where `sample_tokens` inverts the unsorted
    distribution."""
    import torch

    greedy = temperatures <= 0
    safe = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    probabilities = (logits.float() / safe[:, None]).softmax(dim=-1)
    ordered, ids = probabilities.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered
    nucleus = ordered.masked_fill(before > top_ps[:, None], 0.0)
    drawn = ids.gather(-1, _draw(nucleus, uniforms[:, None])).squeeze(-1)
    return torch.where(greedy, logits.argmax(dim=-1), drawn)
