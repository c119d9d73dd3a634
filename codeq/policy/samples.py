"""What the streams of the library backends (transformers' continuous batching, vLLM) keep of a
submitted request while its samples are written, and how a finished sample becomes text.

The engine's own stream (`stream.py`) does the same inline; here it is shared so that every
backend stops, counts, cuts and seeds a sample the way the engine does: done at EOS, at the
close of the first fenced block ('code') or at the end of the score line ('score'), or after
`max_new_tokens`; the count includes the stop token; a seeded request's sample `k` draws from
its own generator seeded by (seed, k).
"""

from __future__ import annotations

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
        kept = [int(t) for t in tokens[:count]]
        text = tokenizer.decode(kept, skip_special_tokens=True)
        if self.request.stop == "code":
            text = cut_after_code_block(text)
        self.texts[sample.index], self.lengths[sample.index] = text, count
        self.token_ids[sample.index] = kept
        self.unfinished -= 1
        return count

    def result(self) -> GenerationResult:
        return GenerationResult(
            self.texts, len(self.prompt_ids), self.lengths, self.seconds, self.token_ids
        )


def check_request(request: GenerationRequest) -> None:
    if request.n < 1:
        raise ValueError(f"a generation request needs n >= 1 samples, not {request.n}")
