"""GenerationStream: continuous batching. Requests go in at any time, finished ones come out
after any step, and the batch is refilled while it runs.

A search over many trees does not produce its work in rounds: one tree's rewrites finish, are
tested, and its critiques are ready while other trees' rewrites are still being written. Waiting
for the slowest sequence of a round before starting the next leaves most of the batch empty (a
round of rewrites that stop anywhere between 40 and 128 tokens averaged 10 live rows of 16).
Here each `step` first admits waiting requests when enough rows are free, reading their prompts
together, then samples one token for every live sequence, hands back the requests whose samples
have all stopped, and advances the rest by one forward.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from codeq.policy.attention import batch_attention
from codeq.policy.decode_batch import DecodeBatch
from codeq.policy.prefix_cache import LayerKV, PrefixCache
from codeq.policy.requests import GenerationRequest, GenerationResult, GenerationStats
from codeq.policy.sampling import sample_tokens
from codeq.policy.stopping import StopCondition, StopKind, cut_after_code_block


class StreamModel(Protocol):
    """What a stream needs of the engine it decodes for (PolicyEngine is one). The engine
    depends on the stream, never the other way round."""

    model: Any
    tokenizer: Any
    batch_size: int
    stats: GenerationStats
    prefixes: PrefixCache

    def encode_chat(self, messages: Any, prefix: str = "") -> list[int]: ...

    def stop_condition(self, kind: StopKind, prefix: str = "") -> StopCondition: ...

    def read_prompts(
        self, prompts: list[list[int]]
    ) -> tuple[list[tuple[int, ...]], list[tuple[list[LayerKV], Any]]]: ...


REFILL_FRACTION = 0.25  # waiting requests join once this share of the batch's rows is free:
# admitting costs a prompt read and a rebuild of the batch's prompt part, so not every step


@dataclass
class _Ticket:
    """One submitted request and what its samples have produced so far."""

    request: GenerationRequest
    prompt_ids: list[int]
    texts: list[str] = field(init=False)  # by sample
    lengths: list[int] = field(init=False)
    token_ids: list[list[int]] = field(init=False)
    unfinished: int = field(init=False)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.texts = [""] * self.request.n
        self.lengths = [0] * self.request.n
        self.token_ids = [[] for _ in range(self.request.n)]
        self.unfinished = self.request.n

    def result(self) -> GenerationResult:
        return GenerationResult(
            self.texts, len(self.prompt_ids), self.lengths, self.seconds, self.token_ids
        )


@dataclass
class _Sequence:
    """One sample being decoded: a row of the batch."""

    ticket: int
    sample: int
    stop: StopCondition
    generator: Any = None  # the sample's own torch.Generator when its request has a seed
    tokens: list[int] = field(default_factory=list)


def _sample_generator(seed: int | None, sample: int) -> Any:
    """The generator of one sample of a seeded request (CPU: the draw is one number a step)."""
    if seed is None:
        return None
    import torch

    generator = torch.Generator()
    generator.manual_seed((seed * 1_000_003 + sample) % (2**63))
    return generator


class GenerationStream:
    """Continuous batching over one engine: `submit` requests, call `step` until not `busy`.
    At most `engine.batch_size` sequences are decoded at once (a request with more samples
    than that runs alone)."""

    def __init__(self, engine: StreamModel) -> None:
        self.engine = engine
        self.tickets: dict[int, _Ticket] = {}
        self.waiting: deque[int] = deque()
        self.sequences: list[_Sequence] = []  # in batch row order
        self.batch: DecodeBatch | None = None
        self.logits: Any = None  # next-token logits of every live sequence
        self._next_ticket = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.sequences)

    def submit(self, request: GenerationRequest) -> int:
        """Queue a request; returns its ticket, which `step` hands back with the result."""
        if request.n < 1:
            raise ValueError(f"a generation request needs n >= 1 samples, not {request.n}")
        ticket = self._next_ticket
        self._next_ticket += 1
        prompt = self.engine.encode_chat(request.messages, request.prefix)
        self.tickets[ticket] = _Ticket(request, prompt)
        self.waiting.append(ticket)
        return ticket

    def step(self) -> list[tuple[int, GenerationResult]]:
        """Admit waiting requests if there is room, then one token for every live sequence.
        Returns (ticket, result) of every request whose samples have all finished."""
        import torch

        began = time.perf_counter()
        finished: list[tuple[int, GenerationResult]] = []
        with torch.inference_mode():
            if self._room_to_admit():
                self._admit()
            if self.sequences:
                finished = self._decode_step()
        spent = time.perf_counter() - began
        self.engine.stats.seconds += spent
        self._charge(spent, finished)
        return finished

    # -------------------------------------------------------------- admission

    def _room_to_admit(self) -> bool:
        """Admit when the batch is empty, or when enough rows are free and the first waiting
        request fits in them (requests are admitted first come, first served)."""
        if not self.waiting:
            return False
        if not self.sequences:
            return True
        free = self.engine.batch_size - len(self.sequences)
        head = self.tickets[self.waiting[0]].request.n
        return free >= max(1, int(self.engine.batch_size * REFILL_FRACTION)) and head <= free

    def _admit(self) -> None:
        """Waiting requests, first come first served, while their samples fit: their prompts
        are read (each once, after its longest cached prefix) and their samples join."""
        import torch

        free = self.engine.batch_size - len(self.sequences)
        admitted: list[int] = []
        while self.waiting:
            samples = self.tickets[self.waiting[0]].request.n
            if samples > free and (admitted or self.sequences):
                break
            admitted.append(self.waiting.popleft())
            free -= samples
        prompts = [self.tickets[t].prompt_ids for t in admitted]
        distinct, read = self.engine.read_prompts(prompts)
        owner_of = {prompt: owner for owner, prompt in enumerate(distinct)}
        owners: list[int] = []
        for ticket in admitted:
            entry = self.tickets[ticket]
            owner = owner_of[tuple(entry.prompt_ids)]
            for sample in range(entry.request.n):
                stop = self.engine.stop_condition(entry.request.stop, entry.request.prefix)
                generator = _sample_generator(entry.request.seed, sample)
                self.sequences.append(_Sequence(ticket, sample, stop, generator))
                owners.append(owner)
        capacity = max(self.tickets[t].request.max_new_tokens for t in admitted)
        kv = [layers for layers, _ in read]
        if self.batch is None:
            self.batch = DecodeBatch(kv, owners, capacity)
        else:
            self.batch.add(kv, owners, capacity)
        logits = [read[owner][1] for owner in owners]
        self.logits = torch.cat(logits if self.logits is None else [self.logits, *logits])
        self.engine.stats.admissions += 1
        self.engine.stats.prompt_tokens += sum(len(p) for p in prompts)

    # -------------------------------------------------------------- decoding

    def _decode_step(self) -> list[tuple[int, GenerationResult]]:
        """Sample every live sequence; finished ones leave; the rest take one forward."""
        import torch

        assert self.batch is not None
        chosen = self._sample()
        keep: list[int] = []
        finished: list[tuple[int, GenerationResult]] = []
        for row, token in enumerate(chosen.tolist()):
            sequence = self.sequences[row]
            sequence.tokens.append(token)
            request = self.tickets[sequence.ticket].request
            step = len(sequence.tokens)
            if sequence.stop.update(token, step) or step >= request.max_new_tokens:
                finished.extend(self._finish(row, sequence))
            else:
                keep.append(row)
        if not keep:
            self.sequences, self.batch, self.logits = [], None, None
            return finished
        if len(keep) < len(self.sequences):
            index = torch.tensor(keep, device=self.batch.device)
            self.batch.keep(index)
            chosen = chosen[index]
            self.sequences = [self.sequences[row] for row in keep]
        with batch_attention(self.engine.model):
            output = self.engine.model(
                input_ids=chosen[:, None],
                position_ids=self.batch.positions()[:, None],
                use_cache=False,
                kv_batch=self.batch,
            )
        self.batch.advance()
        self.logits = output.logits[:, -1]
        stats = self.engine.stats
        stats.steps += 1
        stats.step_rows += len(keep)
        stats.max_rows = max(stats.max_rows, len(keep))
        return finished

    def _sample(self) -> Any:
        """One token per live sequence, each with its request's temperature and top-p, drawn
        with its own generator's random number when its request has a seed."""
        import torch

        groups: dict[tuple[float, float], list[int]] = {}
        for row, sequence in enumerate(self.sequences):
            request = self.tickets[sequence.ticket].request
            groups.setdefault((request.temperature, request.top_p), []).append(row)
        uniforms = self._uniforms()
        if len(groups) == 1:
            [(temperature, top_p)] = groups
            return sample_tokens(self.logits, temperature, top_p, uniforms)
        chosen = torch.empty(len(self.sequences), dtype=torch.long, device=self.logits.device)
        for (temperature, top_p), rows in groups.items():
            index = torch.tensor(rows, device=self.logits.device)
            chosen[index] = sample_tokens(self.logits[index], temperature, top_p, uniforms[index])
        return chosen

    def _uniforms(self) -> Any:
        """One uniform number per live sequence (rows x 1) for this step's draws."""
        import torch

        values = torch.rand(len(self.sequences), 1)
        for row, sequence in enumerate(self.sequences):
            if sequence.generator is not None:
                values[row] = torch.rand(1, generator=sequence.generator)
        return values.to(self.logits.device)

    def _finish(self, row: int, sequence: _Sequence) -> list[tuple[int, GenerationResult]]:
        """Record a finished sample (keeping its KV when the conversation will continue);
        returns its request's result once every sample of it has finished."""
        assert self.batch is not None
        entry = self.tickets[sequence.ticket]
        if entry.request.keep_cache and self.engine.prefixes.max_tokens:
            written = sequence.tokens[: self.batch.own_length(row)]
            self.engine.prefixes.add(entry.prompt_ids + written, self.batch.sequence_kv(row))
        count = sequence.stop.length or len(sequence.tokens)
        text = self.engine.tokenizer.decode(sequence.tokens[:count], skip_special_tokens=True)
        if entry.request.stop == "code":
            text = cut_after_code_block(text)
        entry.texts[sequence.sample], entry.lengths[sequence.sample] = text, count
        entry.token_ids[sequence.sample] = sequence.tokens[:count]
        entry.unfinished -= 1
        self.engine.stats.sequences += 1
        self.engine.stats.completion_tokens += count
        if entry.unfinished:
            return []
        del self.tickets[sequence.ticket]
        return [(sequence.ticket, entry.result())]

    def _charge(self, spent: float, finished: list[tuple[int, GenerationResult]]) -> None:
        """Share a step's time among the requests it worked for."""
        rows = [s.ticket for s in self.sequences]
        done = [ticket for ticket, _ in finished]
        share = spent / max(1, len(rows) + len(done))
        for ticket in rows:
            if ticket in self.tickets:
                self.tickets[ticket].seconds += share
        for _, result in finished:
            result.seconds += share
