"""What callers ask of the policy engine and what they get back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from codeq.policy.stopping import StopKind
from codeq.schemas import ChatMessage


@dataclass(frozen=True)
class GenerationRequest:
    """One chat prompt to complete `n` times with the same sampling settings."""

    messages: list[ChatMessage]
    n: int = 1
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 768
    prefix: str = ""  # start of the assistant's answer, written for the model (e.g. "Score: ")
    stop: StopKind = "code"  # 'code': end at the close of the first fenced block; 'score': at
    # the end of the line giving a score; 'none': EOS or max_new_tokens only
    keep_cache: bool = False  # keep each completion's KV for reuse: the caller will continue
    # this conversation (a critique of the rewrite, a refinement of it)
    seed: int | None = None  # each sample draws from its own generator seeded by (seed, sample):
    # the same request gives the same samples whatever shares the batch; None: torch's global RNG


@dataclass
class GenerationResult:
    texts: list[str]
    prompt_tokens: int
    completion_tokens: list[int]
    seconds: float = 0.0
    token_ids: list[list[int]] = field(default_factory=list)  # by sample, up to its stop


@dataclass
class GenerationStats:
    """Running totals of one engine (benchmarks and trajectories read them)."""

    admissions: int = 0  # times waiting requests joined the batch (their prompts read together)
    sequences: int = 0  # sequences finished
    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens run through the model (the rest came from cache)
    completion_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0  # decode steps
    step_rows: int = 0  # sequences advanced, summed over decode steps
    max_rows: int = 0  # the most sequences one decode step advanced


class RequestStream(Protocol):
    """Continuous batching as every backend offers it (`policy.stream()`)."""

    @property
    def busy(self) -> bool: ...

    def submit(self, request: GenerationRequest) -> int: ...

    def step(self) -> list[tuple[int, GenerationResult]]: ...


def complete_all(
    stream: RequestStream, requests: Sequence[GenerationRequest]
) -> list[GenerationResult]:
    """Submit every request to `stream` and step it until all are done; results in the
    requests' order (the blocking `generate` of every backend)."""
    tickets = [stream.submit(request) for request in requests]
    results: dict[int, GenerationResult] = {}
    while stream.busy:
        results.update(stream.step())
    return [results[ticket] for ticket in tickets]
