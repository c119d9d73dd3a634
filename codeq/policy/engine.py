"""PolicyEngine: load a causal LM once (HF id, folder, .gguf, 'smollm2'), generate in batches.

Device, dtype and quantization are resolved from `PolicyConfig`:

- device 'auto': CUDA when available, else CPU.
- dtype 'auto': bf16 on CUDA when supported (else fp16); on CPU bf16 when the CPU has native
  bf16 arithmetic (AVX512-BF16 or AMX; measured ~2x fp32 for batched decoding), else fp32.
- quantization 'auto': 4-bit NF4 via bitsandbytes on CUDA, none on CPU. 'nf4' on CPU is a
  ConfigError (bitsandbytes' 4-bit kernels are CUDA kernels).

Generation groups requests with the same sampling settings, expands each request into `n`
sequences, sorts them by prompt length (less padding) and decodes chunks of `batch_size`
sequences together in our own loop: each distinct prompt is read once and its KV cache shared by
its `n` samples (on CPU reading prompts dominates), and a sequence leaves the batch as soon as it
stops (at EOS, or at the close of its first fenced code block).
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from codeq.config import PolicyConfig
from codeq.errors import ConfigError, ModelLoadError
from codeq.policy.gguf import SMOLLM2_ALIAS, materialize_gguf, smollm2_gguf_path
from codeq.schemas import ChatMessage

log = logging.getLogger(__name__)

FENCE = "```"
StopKind = Literal["code", "score", "none"]
# 'score': a critique is done at the end of the line that gives its score ("Score: 7/10").
_SCORE_LINE = re.compile(r"score\W{0,3}\d+(?:\.\d+)?(?:\s*(?:/|out of)\s*\d+)?[^\n]*\n", re.I)


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


@dataclass
class GenerationResult:
    texts: list[str]
    prompt_tokens: int
    completion_tokens: list[int]
    seconds: float = 0.0


@dataclass
class GenerationStats:
    """Running totals of one engine (benchmarks and trajectories read them)."""

    calls: int = 0
    sequences: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens run through the model (the rest came from cache)
    completion_tokens: int = 0
    seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


# ---------------------------------------------------------------- device, dtype, quantization


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 dot products (AVX512-BF16 or AMX)."""
    import torch

    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def resolve_device(config: PolicyConfig) -> str:
    import torch

    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "policy.device is 'cuda' but no CUDA device is available",
            hint="set policy.device to 'auto' or 'cpu' (CODEQ_POLICY__DEVICE=cpu)",
        )
    return config.device


def resolve_dtype(config: PolicyConfig, device: str) -> Any:
    import torch

    named = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if config.dtype != "auto":
        return named[config.dtype]
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


def resolve_quantization(config: PolicyConfig, device: str) -> str:
    if config.quantization == "auto":
        return "nf4" if device == "cuda" else "none"
    if config.quantization == "nf4" and device != "cuda":
        raise ConfigError(
            "policy.quantization 'nf4' needs a CUDA device (bitsandbytes 4-bit kernels)",
            hint="use policy.quantization 'auto' or 'none' on CPU",
        )
    return config.quantization


def resolve_model_path(model: str, cache_dir: str) -> str:
    """Local folder, materialized GGUF folder, or the HF id unchanged."""
    if model == SMOLLM2_ALIAS:
        return str(materialize_gguf(smollm2_gguf_path(), cache_dir))
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        return str(materialize_gguf(path, cache_dir))
    if path.is_dir():
        return str(path)
    if path.exists() or model.startswith((".", "/", "~")):
        raise ModelLoadError(
            f"model path {model} is not a model folder or .gguf file",
            hint="pass a folder with config.json and weights, a .gguf file, or a Hugging Face id",
        )
    return model


# ---------------------------------------------------------------- stopping


class StopTracker:
    """Per sequence: done at EOS, or (stop='code') when the first fenced block closes, or
    (stop='score') at the end of the line giving a score. Records each sequence's completion
    length (the EOS token counted, padding never)."""

    def __init__(self, tokenizer: Any, kinds: list[StopKind], prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(tokenizer)
        self.kinds = kinds
        self.tails = [prefix] * len(kinds)
        self.lengths: list[int | None] = [None] * len(kinds)

    def update(self, row: int, token: int, step: int) -> bool:
        """Take sequence `row`'s `step`-th new token (from 1); True once it is finished."""
        if self.lengths[row] is not None:
            return True
        if token in self.eos_ids:
            self.lengths[row] = step
            return True
        if self.kinds[row] == "none":
            return False
        self.tails[row] += self.tokenizer.decode([token])
        finished = (
            closes_code_block(self.tails[row])
            if self.kinds[row] == "code"
            else gives_score(self.tails[row])
        )
        if finished:
            self.lengths[row] = step
        return finished


def closes_code_block(text: str) -> bool:
    opening = text.find(FENCE)
    if opening < 0:
        return False
    body_start = text.find("\n", opening)
    return body_start >= 0 and text.find(FENCE, body_start) >= 0


def gives_score(text: str) -> bool:
    """A full line holding a score such as 'Score: 7/10' has been written."""
    return _SCORE_LINE.search(text) is not None


def cut_after_code_block(text: str) -> str:
    opening = text.find(FENCE)
    if opening < 0:
        return text
    body_start = text.find("\n", opening)
    if body_start < 0:
        return text
    closing = text.find(FENCE, body_start)
    return text if closing < 0 else text[: closing + len(FENCE)]


def _eos_ids(tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id >= 0:
            ids.add(token_id)
    return ids


# ---------------------------------------------------------------- the engine


@dataclass
class _Sequence:
    request: int
    prompt_ids: list[int]


class PolicyEngine:
    """A loaded model and tokenizer; `generate` is batched and preserves request order."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        device: str,
        batch_size: int = 16,
        max_prompt_tokens: int = 3072,
        quantization: str = "none",
        prefix_cache_tokens: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.device = device
        self.batch_size = batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.quantization = quantization
        self.stats = GenerationStats()
        self.prefixes = PrefixCache(prefix_cache_tokens)

    @property
    def dtype(self) -> Any:
        return next(self.model.parameters()).dtype

    @classmethod
    def load(cls, config: PolicyConfig, *, seed: int | None = None) -> PolicyEngine:
        """Load model (+ optional LoRA adapter) and tokenizer as `config` says."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(config)
        quantization = resolve_quantization(config, device)
        dtype = resolve_dtype(config, device)
        path = resolve_model_path(config.model, config.cache_dir)
        if seed is not None:
            torch.manual_seed(seed)
        if device == "cpu" and config.cpu_threads:
            torch.set_num_threads(config.cpu_threads)
        kwargs: dict[str, Any] = {"dtype": dtype}
        if quantization == "nf4":
            kwargs["quantization_config"] = _nf4_config(dtype)
            kwargs["device_map"] = {"": 0}
        cache = str(Path(config.cache_dir).expanduser())
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, cache_dir=cache)
            model = AutoModelForCausalLM.from_pretrained(path, cache_dir=cache, **kwargs)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"cannot load model {config.model}: {str(exc).splitlines()[0]}",
                hint="check policy.model: a local folder, a .gguf file, 'smollm2', or a "
                "Hugging Face id reachable from here",
            ) from exc
        if quantization != "nf4":
            model = model.to(device)  # type: ignore[arg-type]
        if config.adapter:
            model = _apply_adapter(model, config.adapter)
        model.eval()
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if tokenizer.chat_template is None:
            raise ModelLoadError(
                f"the tokenizer of {config.model} has no chat template",
                hint="use an instruction-tuned model (its tokenizer defines a chat template)",
            )
        log.info("policy %s on %s (%s, quantization=%s)", config.model, device, dtype, quantization)
        return cls(
            model,
            tokenizer,
            name=config.model,
            device=device,
            batch_size=config.batch_size,
            max_prompt_tokens=config.max_prompt_tokens,
            quantization=quantization,
            prefix_cache_tokens=config.prefix_cache_tokens,
        )

    # -------------------------------------------------------------- tokens

    def encode_chat(self, messages: Sequence[ChatMessage], prefix: str = "") -> list[int]:
        """Token ids of the chat prompt (template + generation prompt + the answer's `prefix`),
        cut from the top."""
        rendered = self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            tokenize=False,
            add_generation_prompt=True,
        )
        rendered += prefix
        ids: list[int] = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_tokens :]

    # -------------------------------------------------------------- generation

    def generate(
        self, requests: Sequence[GenerationRequest], *, seed: int | None = None
    ) -> list[GenerationResult]:
        """Complete every request `n` times; batched across requests; order preserved."""
        import torch

        if seed is not None:
            torch.manual_seed(seed)
        prompts = [self.encode_chat(r.messages, r.prefix) for r in requests]
        if self.prefixes.max_tokens:
            # Across the whole call: sorted by length into chunks, siblings can part ways.
            with torch.inference_mode():
                self._prefill_shared_prefixes(prompts)
        texts: list[list[str]] = [[] for _ in requests]
        lengths: list[list[int]] = [[] for _ in requests]
        seconds = [0.0] * len(requests)
        for group in _group_by_settings(requests):
            sequences = [
                _Sequence(index, prompts[index])
                for index in group
                for _ in range(requests[index].n)
            ]
            sequences.sort(key=lambda s: len(s.prompt_ids))
            for start in range(0, len(sequences), self.batch_size):
                chunk = sequences[start : start + self.batch_size]
                began = time.perf_counter()
                outputs = self._generate_chunk(chunk, requests[group[0]])
                self.stats.seconds += time.perf_counter() - began
                spent = (time.perf_counter() - began) / len(chunk)
                for sequence, (text, count) in zip(chunk, outputs, strict=True):
                    texts[sequence.request].append(text)
                    lengths[sequence.request].append(count)
                    seconds[sequence.request] += spent
        results = [
            GenerationResult(texts[i], len(prompts[i]), lengths[i], seconds[i])
            for i in range(len(requests))
        ]
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        return results

    def _generate_chunk(
        self, chunk: list[_Sequence], settings: GenerationRequest
    ) -> list[tuple[str, int]]:
        """Sample every sequence of `chunk` to its stop, in one batch:
        1. read each distinct prompt once (its n samples share the prompt's KV cache),
        2. give every sequence a copy of its prompt's cache, left-padded to one width,
        3. decode one token per live sequence per step, and drop finished sequences from
           the batch so the long tail is not paid for by the whole chunk."""
        import torch

        tracker = StopTracker(self.tokenizer, [settings.stop] * len(chunk), settings.prefix)
        with torch.inference_mode():
            # 1. one prefill per distinct prompt (shared prefixes were read once before)
            distinct = {s.request: s.prompt_ids for s in chunk}
            prefills = {request: self._prefill(ids) for request, ids in distinct.items()}
            # 2. one left-padded batch over all sequences
            width = max(len(s.prompt_ids) for s in chunk)
            cache = _stack_caches(
                self.model.config,
                [prefills[s.request][0] for s in chunk],
                [width - len(s.prompt_ids) for s in chunk],
                width + settings.max_new_tokens,
            )
            logits = torch.cat([prefills[s.request][1] for s in chunk])
            del prefills
            device = self.model.device
            # Over the whole preallocated cache: later positions are hidden by causality.
            attention = torch.tensor(
                [
                    [0] * (width - len(s.prompt_ids))
                    + [1] * (len(s.prompt_ids) + settings.max_new_tokens)
                    for s in chunk
                ],
                device=device,
            )
            positions = torch.tensor([len(s.prompt_ids) for s in chunk], device=device)
            live = list(range(len(chunk)))  # batch row -> index in chunk
            tokens: list[list[int]] = [[] for _ in chunk]
            # 3. decode
            for step in range(1, settings.max_new_tokens + 1):
                chosen = _sample(logits, settings.temperature, settings.top_p)
                keep = []
                for row, token in enumerate(chosen.tolist()):
                    tokens[live[row]].append(token)
                    if not tracker.update(live[row], token, step):
                        keep.append(row)
                if not keep or step == settings.max_new_tokens:
                    break
                if len(keep) < len(live):
                    index = torch.tensor(keep, device=device)
                    _select_rows(cache, index)
                    attention, positions, chosen = attention[index], positions[index], chosen[index]
                    live = [live[row] for row in keep]
                output = self.model(
                    input_ids=chosen[:, None],
                    attention_mask=attention,
                    position_ids=positions[:, None],
                    past_key_values=cache,
                    cache_position=torch.tensor([width + step - 1], device=device),
                    use_cache=True,
                )
                logits = output.logits[:, -1]
                positions = positions + 1
        results: list[tuple[str, int]] = []
        for row, generated in enumerate(tokens):
            count = tracker.lengths[row] or len(generated)
            text = self.tokenizer.decode(generated[:count], skip_special_tokens=True)
            if settings.stop == "code":
                text = cut_after_code_block(text)
            results.append((text, count))
        self.stats.calls += 1
        self.stats.sequences += len(chunk)
        self.stats.batch_sizes.append(len(chunk))
        self.stats.completion_tokens += sum(count for _, count in results)
        return results

    def _prefill(self, prompt_ids: list[int]) -> tuple[Any, Any]:
        """(KV cache, next-token logits) of one prompt, read without padding; only the tokens
        after the longest prefix already in the prefix cache go through the model."""
        import torch

        reused, cache = self.prefixes.longest_prefix(prompt_ids)
        ids = torch.tensor([prompt_ids[reused:]], device=self.model.device)
        output = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.stats.prefilled_tokens += len(prompt_ids) - reused
        self.prefixes.add(prompt_ids, output.past_key_values)
        return output.past_key_values, output.logits[:, -1]

    def _prefill_shared_prefixes(self, prompts: list[list[int]]) -> None:
        """Read once the long prefix that several of these prompts share (sibling critiques
        differ only in the program at the end), so each then reads only its own tail."""
        ordered = sorted(prompts)
        for before, after in zip(ordered, ordered[1:], strict=False):
            shared = _common_prefix_length(before, after)
            worth_it = MIN_SHARED_PREFIX <= shared < min(len(before), len(after))
            if worth_it and self.prefixes.longest_prefix(before[:shared])[0] < shared - 1:
                self._prefill(before[:shared])


MIN_SHARED_PREFIX = 64  # tokens; shorter shared prefixes are not worth a separate prefill


def _common_prefix_length(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


class PrefixCache:
    """KV caches of prompts read before, least recently used dropped first, within a budget of
    `max_tokens` prompt tokens. A lookup returns a copy that the model may extend freely."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.tokens = 0

    def longest_prefix(self, prompt_ids: list[int]) -> tuple[int, Any]:
        """(tokens reused, cache copy or None) for the longest cached prefix of the prompt; at
        least one token is always left to read, since its logits start the completion."""
        best: tuple[int, ...] | None = None
        for key in self.entries:
            if len(key) > len(best or ()) and tuple(prompt_ids[: len(key)]) == key:
                best = key
        if best is None:
            return 0, None
        self.entries.move_to_end(best)
        reused = min(len(best), len(prompt_ids) - 1)
        return reused, _cache_copy(self.entries[best], reused)

    def add(self, prompt_ids: list[int], cache: Any) -> None:
        key = tuple(prompt_ids)
        if self.max_tokens < len(key) or key in self.entries:
            return
        self.entries[key] = _cache_copy(cache, len(key))
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            dropped, _ = self.entries.popitem(last=False)
            self.tokens -= len(dropped)


def _cache_copy(cache: Any, length: int) -> Any:
    """A cache holding the first `length` positions of `cache`, sharing its tensors: the model
    appends by making new tensors, so the original is never changed."""
    from transformers import DynamicCache

    return DynamicCache(
        [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in cache.layers]
    )


def _stack_caches(config: Any, caches: list[Any], left_pads: list[int], max_length: int) -> Any:
    """One preallocated batch cache (`max_length` positions) holding the single-prompt caches,
    each left-padded by zeros (masked out). Preallocated, a decode step writes one position in
    place instead of copying the whole cache as a growing cache does (on CPU that copy, not
    the model, dominated large batches)."""
    import torch
    from transformers import StaticCache

    def padded(tensor: Any, pad: int) -> Any:
        return torch.nn.functional.pad(tensor, (0, 0, pad, 0)) if pad else tensor

    batch = StaticCache(config=config, max_cache_len=max_length)
    for layer in range(len(caches[0].layers)):
        keys = [padded(c.layers[layer].keys, p) for c, p in zip(caches, left_pads, strict=True)]
        values = [padded(c.layers[layer].values, p) for c, p in zip(caches, left_pads, strict=True)]
        batch.update(torch.cat(keys), torch.cat(values), layer)
    return batch


def _select_rows(cache: Any, index: Any) -> None:
    """Keep only the batch rows in `index` (finished sequences leave the batch)."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)
        if hasattr(layer, "max_batch_size"):
            layer.max_batch_size = len(index)


def _sample(logits: Any, temperature: float, top_p: float) -> Any:
    """Greedy at temperature 0; else nucleus sampling at `temperature` (fp32 softmax)."""
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True, dim=-1)
        probabilities = ordered.softmax(dim=-1)
        # Drop a token once the ones before it already cover top_p (the first always stays).
        beyond = probabilities.cumsum(dim=-1) - probabilities > top_p
        ordered = ordered.masked_fill(beyond, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
    return torch.multinomial(scaled.softmax(dim=-1), num_samples=1).squeeze(-1)


def _group_by_settings(requests: Sequence[GenerationRequest]) -> list[list[int]]:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for index, request in enumerate(requests):
        key = (
            request.temperature,
            request.top_p,
            request.max_new_tokens,
            request.stop,
            request.prefix,
        )
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def _nf4_config(dtype: Any) -> Any:
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError as exc:
        raise ModelLoadError(
            "4-bit NF4 needs bitsandbytes",
            hint="pip install bitsandbytes, or set quantization none",
        ) from exc
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_use_double_quant=True,
    )


def _apply_adapter(model: Any, adapter: str) -> Any:
    from peft import PeftModel

    folder = Path(adapter).expanduser()
    if not (folder / "adapter_config.json").is_file():
        raise ModelLoadError(
            f"LoRA adapter not found: {folder} has no adapter_config.json",
            hint="point policy.adapter at the adapter/ folder written by `codeq train`",
        )
    try:
        return PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot apply adapter {folder}: {exc}") from exc
