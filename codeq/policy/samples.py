"""What every stream keeps of a submitted request while its samples are written (`Pending`), how
a finished sample becomes text, and the stream the library backends (transformers' continuous
batching, vLLM) share (`BackendStream`).

The engine's own stream (`stream.py`) stops and seeds its samples inline; `Sample` does the
same for the library backends, so that every backend stops, counts, cuts and seeds a sample the
way the engine does: done at EOS, at the close of the first fenced block ('code') or at the end
of the score line ('score'), or after `max_new_tokens`; the count includes the stop token; a
seeded request's sample `k` draws from its own generator seeded by (seed, k).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from codeq.policy.requests import GenerationRequest, GenerationResult
from codeq.policy.stopping import StopCondition, cut_after_code_block


def sample_seed(seed: int, sample: int) -> int:
    """The seed of sample `sample` of a request seeded with `seed` (the engine's stream seeds
    its generators the same way)."""
    return (seed * 1_000_003 + sample) % (2**63)


def sample_generator(seed: int | None, sample: int) -> Any:
    """A torch.Generator for one sample of a seeded request; None without a seed."""
    if seed is None:
        return None
    import torch

    generator = torch.Generator()
    generator.manual_seed(sample_seed(seed, sample))
    return generator


@dataclass
class Sample:
    """One sample being written: its stop rule fed with its tokens as they come."""

    ticket: int
    index: int  # which sample of its request
    stop: StopCondition
    max_new_tokens: int
    generator: Any = None  # the sample's own torch.Generator when its request has a seed
    fed: int = 0  # tokens given to `stop` so far
    draws: int = 0  # uniforms drawn so far (one a token)

    def feed(self, tokens: Sequence[int]) -> bool:
        """Give the stop rule the tokens it has not seen; True once the sample is done by it
        (EOS, the closing fence, the score line) or by its token budget."""
        while self.fed < len(tokens) and self.stop.length is None:
            self.fed += 1
            self.stop.update(int(tokens[self.fed - 1]), self.fed)
        return self.stop.length is not None or self.fed >= self.max_new_tokens

    def uniform(self) -> float:
        """The random number of this sample's next draw: from its own generator when seeded,
        else from torch's global one."""
        import torch

        self.draws += 1
        return float(torch.rand(1, generator=self.generator))

    def length(self, written: int) -> int:
        """Tokens that count as the completion when `written` were generated: up to and
        including the stop token, never past the budget."""
        return min(self.stop.length or written, written, self.max_new_tokens)


@dataclass
class Pending:
    """One submitted request and what its samples have produced so far."""

    request: GenerationRequest
    prompt_ids: list[int]
    texts: list[str] = field(init=False)
    lengths: list[int] = field(init=False)
    token_ids: list[list[int]] = field(init=False)
    unfinished: int = field(init=False)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.texts = [""] * self.request.n
        self.lengths = [0] * self.request.n
        self.token_ids = [[] for _ in range(self.request.n)]
        self.unfinished = self.request.n

    def finish(self, sample: Sample, tokens: Sequence[int], tokenizer: Any) -> int:
        """Record a finished sample (its generated `tokens`, possibly past its stop); returns
        how many tokens count as its completion."""
        sample.feed(tokens)
        count = sample.length(len(tokens))
        self.record(sample.index, [int(t) for t in tokens[:count]], tokenizer)
        return count

    def record(self, index: int, kept: list[int], tokenizer: Any) -> None:
        """Sample `index` has finished with the tokens `kept` (its completion, up to and
        including its stop): its text, cut after the first fenced block for a 'code' request."""
        text = tokenizer.decode(kept, skip_special_tokens=True)
        if self.request.stop == "code":
            text = cut_after_code_block(text)
        self.texts[index], self.lengths[index] = text, len(kept)
        self.token_ids[index] = kept
        self.unfinished -= 1

    def result(self) -> GenerationResult:
        return GenerationResult(
            self.texts, len(self.prompt_ids), self.lengths, self.seconds, self.token_ids
        )


def check_request(request: GenerationRequest) -> None:
    if request.n < 1:
        raise ValueError(f"a generation request needs n >= 1 samples, not {request.n}")


class BackendStream:
    """Requests in at any time, (ticket, result) out after any step: what the streams of the
    library backends share. A subclass says how a request joins its backend's batch (`_add`)
    and how one forward of that batch runs (`_forward`); the backend calls `sample_done` for
    each sample as it stops."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.pending: dict[int, Pending] = {}
        self.finished: list[tuple[int, GenerationResult]] = []
        self._next_ticket = 0

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.finished)

    def submit(self, request: GenerationRequest) -> int:
        check_request(request)
        ticket = self._next_ticket
        self._next_ticket += 1
        prompt = self.policy.encode_chat(request.messages, request.prefix)
        self.pending[ticket] = Pending(request, prompt)
        self._add(ticket, request, prompt)
        return ticket

    def step(self) -> list[tuple[int, GenerationResult]]:
        """One forward (when none of this stream's results are waiting); returns this
        stream's requests whose samples have all finished."""
        if not self.finished and self.pending:
            live = list(self.pending.values())
            began = time.perf_counter()
            self._forward()
            spent = time.perf_counter() - began
            self.policy.stats.seconds += spent
            for entry in live:
                entry.seconds += spent / len(live)
        done, self.finished = self.finished, []
        return done

    def sample_done(self, sample: Sample, tokens: Sequence[int]) -> None:
        entry = self.pending[sample.ticket]
        count = entry.finish(sample, tokens, self.policy.tokenizer)
        self.policy.stats.sequences += 1
        self.policy.stats.completion_tokens += count
        if not entry.unfinished:
            del self.pending[sample.ticket]
            self.finished.append((sample.ticket, entry.result()))

    def _add(self, ticket: int, request: GenerationRequest, prompt: list[int]) -> None:
        raise NotImplementedError

    def _forward(self) -> None:
        raise NotImplementedError
