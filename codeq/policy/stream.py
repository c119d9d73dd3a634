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
from codeq.policy.samples import Pending, check_request, sample_seed
from codeq.policy.sampling import sample_tokens
from codeq.policy.stopping import StopCondition, StopKind


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
class _Sequence:
    """One sample being decoded: a row of the batch."""

    ticket: int
    sample: int
    stop: StopCondition
    seed: int | None = None  # its own generator's seed when its request has one
    tokens: list[int] = field(default_factory=list)


def _sample_uniforms(seed: int, count: int) -> Any:
    """The first `count` numbers of one seeded sample's own generator: the uniforms of its
    draws, one a token (a block of torch.rand on a CPU generator is the same numbers as one
    call a number)."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed)
    return torch.rand(count, generator=generator)


class GenerationStream:
    """Continuous batching over one engine: `submit` requests, call `step` until not `busy`.
    At most `engine.batch_size` sequences are decoded at once (a request with more samples
    than that runs alone)."""

    def __init__(self, engine: StreamModel) -> None:
        self.engine = engine
        self.tickets: dict[int, Pending] = {}
        self.waiting: deque[int] = deque()
        self.sequences: list[_Sequence] = []  # in batch row order
        self.batch: DecodeBatch | None = None
        self.logits: Any = None  # next-token logits of every live sequence
        # By row: the uniforms of a seeded sample's draws, one column a token (on the device,
        # read at the row's length), and whether the row is seeded.
        self.draws: Any = None
        self.seeded: Any = None
        self._any_seeded = False
        self._settings: list[tuple[float, float, Any]] = []  # (temperature, top-p, rows)
        self._next_ticket = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.sequences)

    def submit(self, request: GenerationRequest) -> int:
        """Queue a request; returns its ticket, which `step` hands back with the result."""
        check_request(request)
        ticket = self._next_ticket
        self._next_ticket += 1
        prompt = self.engine.encode_chat(request.messages, request.prefix)
        self.tickets[ticket] = Pending(request, prompt)
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
        joining: list[_Sequence] = []
        for ticket in admitted:
            entry = self.tickets[ticket]
            owner = owner_of[tuple(entry.prompt_ids)]
            for sample in range(entry.request.n):
                stop = self.engine.stop_condition(entry.request.stop, entry.request.prefix)
                seed = (
                    None if entry.request.seed is None else sample_seed(entry.request.seed, sample)
                )
                joining.append(_Sequence(ticket, sample, stop, seed))
                owners.append(owner)
        capacity = max(self.tickets[t].request.max_new_tokens for t in admitted)
        kv = [layers for layers, _ in read]
        if self.batch is None:
            self.batch = DecodeBatch(kv, owners, capacity)
        else:
            self.batch.add(kv, owners, capacity)
        logits = [read[owner][1] for owner in owners]
        self.logits = torch.cat(logits if self.logits is None else [self.logits, *logits])
        self._add_draws(joining)
        self.sequences += joining
        self._rows_changed()
        self.engine.stats.admissions += 1
        self.engine.stats.prompt_tokens += sum(len(p) for p in prompts)

    def _add_draws(self, joining: list[_Sequence]) -> None:
        """The joining rows' uniforms: a seeded sample's whole budget drawn now from its own
        generator (the numbers it would draw one a step), copied to the device once."""
        import torch

        width = max(self.tickets[s.ticket].request.max_new_tokens for s in joining)
        draws = torch.zeros(len(joining), width)
        for row, sequence in enumerate(joining):
            if sequence.seed is not None:
                budget = self.tickets[sequence.ticket].request.max_new_tokens
                draws[row, :budget] = _sample_uniforms(sequence.seed, budget)
        device = self.logits.device
        draws = draws.to(device)
        seeded = torch.tensor([s.seed is not None for s in joining], device=device)
        if self.draws is not None:
            width = max(width, self.draws.shape[1])
            draws = torch.cat([_widened(self.draws, width), _widened(draws, width)])
            seeded = torch.cat([self.seeded, seeded])
        self.draws, self.seeded = draws, seeded

    def _rows_changed(self) -> None:
        """What the sampling of a step needs that changes only when rows join or leave: the
        rows of each (temperature, top-p), whether any row is seeded."""
        import torch

        groups: dict[tuple[float, float], list[int]] = {}
        for row, sequence in enumerate(self.sequences):
            request = self.tickets[sequence.ticket].request
            groups.setdefault((request.temperature, request.top_p), []).append(row)
        device = self.logits.device
        self._settings = [
            (temperature, top_p, None if len(groups) == 1 else torch.tensor(rows, device=device))
            for (temperature, top_p), rows in groups.items()
        ]
        self._any_seeded = any(s.seed is not None for s in self.sequences)

    # -------------------------------------------------------------- decoding

    def _decode_step(self) -> list[tuple[int, GenerationResult]]:
        """Sample every live sequence; finished ones leave; the rest take one forward."""
        import torch

        assert self.batch is not None
        chosen = self._sample()
        keep: list[int] = []
        finished: list[tuple[int, GenerationResult]] = []
        for row, token in enumerate(chosen.tolist()):  # the step's one read from the device
            sequence = self.sequences[row]
            sequence.tokens.append(token)
            request = self.tickets[sequence.ticket].request
            step = len(sequence.tokens)
            if sequence.stop.update(token, step) or step >= request.max_new_tokens:
                finished.extend(self._finish(row, sequence))
            else:
                keep.append(row)
        if not keep:
            self.sequences, self.batch, self.logits, self.draws = [], None, None, None
            return finished
        if len(keep) < len(self.sequences):
            rows = fill_holes(keep, len(self.sequences))
            self.batch.keep(rows)
            index = torch.tensor(rows, device=chosen.device)
            chosen, self.draws, self.seeded = chosen[index], self.draws[index], self.seeded[index]
            self.sequences = [self.sequences[row] for row in rows]
            self._rows_changed()
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

        uniforms = self._uniforms()
        if len(self._settings) == 1:
            [(temperature, top_p, _)] = self._settings
            return sample_tokens(self.logits, temperature, top_p, uniforms)
        chosen = torch.empty(len(self.sequences), dtype=torch.long, device=self.logits.device)
        for temperature, top_p, index in self._settings:
            chosen[index] = sample_tokens(self.logits[index], temperature, top_p, uniforms[index])
        return chosen

    def _uniforms(self) -> Any:
        """One uniform number per live sequence (rows x 1) for this step's draws: torch's
        global generator's for every row (drawn even for rows that do not use them, so that
        what a seedless request draws depends only on the batch), a seeded row's own at its
        length."""
        import torch

        assert self.batch is not None
        values = torch.rand(len(self.sequences), 1, device=self.logits.device)
        if not self._any_seeded:
            return values
        own = self.draws.gather(1, self.batch.lengths[:, None])
        return torch.where(self.seeded[:, None], own, values)

    def _finish(self, row: int, sequence: _Sequence) -> list[tuple[int, GenerationResult]]:
        """Record a finished sample (keeping its KV when the conversation will continue);
        returns its request's result once every sample of it has finished."""
        assert self.batch is not None
        entry = self.tickets[sequence.ticket]
        if entry.request.keep_cache and self.engine.prefixes.max_tokens:
            written = sequence.tokens[: self.batch.own_length(row)]
            self.engine.prefixes.add(entry.prompt_ids + written, self.batch.sequence_kv(row))
        count = sequence.stop.length or len(sequence.tokens)
        entry.record(sequence.sample, sequence.tokens[:count], self.engine.tokenizer)
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


def fill_holes(keep: list[int], rows: int) -> list[int]:
    """The rows that stay (`keep`, ascending, of `rows`), in their new order: each leaving row
    below the new end takes a staying row from past it, the others stay in place (so only
    those few rows' KV move)."""
    end = len(keep)
    movers = iter(row for row in keep if row >= end)
    staying = set(keep)
    return [row if row in staying else next(movers) for row in range(end)]


def _widened(draws: Any, width: int) -> Any:
    """[rows, columns] draws with zero columns added up to `width`."""
    import torch.nn.functional as F

    return F.pad(draws, (0, width - draws.shape[1]))
