"""PolicyEngine: load a causal LM once (HF id, folder, .gguf, 'smollm2'), generate in batches.

Device, dtype and quantization are resolved from `PolicyConfig`:

- device 'auto': CUDA when available, else CPU.
- dtype 'auto': bf16 on CUDA when supported (else fp16); on CPU bf16 when the CPU has native
  bf16 arithmetic (AVX512-BF16 or AMX; measured ~2x fp32 for batched decoding), else fp32.
- quantization 'auto': 4-bit NF4 via bitsandbytes on CUDA, none on CPU. 'nf4' on CPU is a
  ConfigError (bitsandbytes' 4-bit kernels are CUDA kernels).

Generation runs by continuous batching (`GenerationStream`, `stream()`): requests join the
batch when rows are free, each distinct prompt read once after the longest prefix kept in the
prefix cache, the tails of many prompts in one forward (`PromptBatch`); each prompt's KV kept
once for all its samples (`DecodeBatch`). A sequence leaves the batch as soon as it stops (at
EOS, at the close of its first fenced code block, or after the line giving a score).
`generate` is the blocking form: submit everything, step until done.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codeq.config import PolicyConfig
from codeq.cpus import available_cpus
from codeq.errors import ConfigError, ModelLoadError
from codeq.policy.attention import batch_attention
from codeq.policy.decode_batch import groups_by_length
from codeq.policy.prefix_cache import LayerKV, PrefixCache, common_prefix_length
from codeq.policy.prompt_batch import PromptBatch
from codeq.policy.requests import (
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    complete_all,
)
from codeq.policy.source import (
    announce_load,
    load_error,
    require_adapter_dir,
    resolve_model_source,
)
from codeq.policy.stopping import StopCondition, StopKind, eos_ids
from codeq.policy.stream import GenerationStream
from codeq.schemas import ChatMessage

__all__ = ["GenerationRequest", "GenerationResult", "GenerationStats", "PolicyEngine"]

log = logging.getLogger(__name__)

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
    """'none', 'nf4' or 'fp8' ('fp8' only the vllm backend loads: the engine refuses it)."""
    if config.quantization == "auto":
        return "nf4" if device == "cuda" else "none"
    if config.quantization == "nf4" and device != "cuda":
        raise ConfigError(
            "policy.quantization 'nf4' needs a CUDA device (bitsandbytes 4-bit kernels)",
            hint="use policy.quantization 'auto' or 'none' on CPU",
        )
    return config.quantization


# ---------------------------------------------------------------- the engine


class PolicyEngine:
    """A loaded model and tokenizer; `generate` is batched and preserves request order."""

    backend = "engine"

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
        self.eos_ids = eos_ids(tokenizer)

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
        if quantization == "fp8":
            raise ConfigError(
                "policy.quantization 'fp8' needs policy.backend 'vllm' (vLLM's fp8 method)",
                hint="set policy.quantization to 'auto', 'nf4' or 'none', or use vllm on CUDA",
            )
        dtype = resolve_dtype(config, device)
        path = resolve_model_source(config.model, config.cache_dir)
        if seed is not None:
            torch.manual_seed(seed)
        if device == "cpu":
            # 0 keeps torch's default (one thread per core, or OMP_NUM_THREADS) unless a CPU
            # quota (a pod's limits.cpu) allows fewer
            threads = config.cpu_threads or min(torch.get_num_threads(), available_cpus())
            torch.set_num_threads(threads)
        kwargs: dict[str, Any] = {"dtype": dtype}
        if quantization == "nf4":
            kwargs["quantization_config"] = nf4_config(dtype)
            kwargs["device_map"] = {"": 0}
        cache = str(Path(config.cache_dir).expanduser())
        announce_load(config.model, path, "policy")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, cache_dir=cache)
            model = AutoModelForCausalLM.from_pretrained(path, cache_dir=cache, **kwargs)
        except (OSError, ValueError) as exc:
            raise load_error(config.model, path, exc) from exc
        if quantization != "nf4":
            model = model.to(device)  # type: ignore[arg-type]
        if config.adapter:
            model = _apply_adapter(model, config.adapter)
        model.eval()
        prepare_tokenizer(tokenizer, config.model)
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

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id or 0)

    def clear_prefix_cache(self) -> None:
        """Forget every kept prompt (benchmarks start each condition cold)."""
        self.prefixes.clear()

    # -------------------------------------------------------------- tokens

    def encode_chat(self, messages: Sequence[ChatMessage], prefix: str = "") -> list[int]:
        """Token ids of the chat prompt (template + generation prompt + the answer's `prefix`),
        cut from the top."""
        return encode_chat(self.tokenizer, messages, prefix, self.max_prompt_tokens)

    # -------------------------------------------------------------- generation

    def stream(self) -> GenerationStream:
        """A continuous batch over this engine: submit requests any time, step until done."""
        return GenerationStream(self)

    def generate(
        self, requests: Sequence[GenerationRequest], *, seed: int | None = None
    ) -> list[GenerationResult]:
        """Complete every request `n` times, batched across requests; order preserved."""
        import torch

        if seed is not None:
            torch.manual_seed(seed)
        return complete_all(self.stream(), requests)

    def stop_condition(self, kind: StopKind, prefix: str = "") -> StopCondition:
        return StopCondition(self.tokenizer, self.eos_ids, kind, prefix)

    def read_prompts(
        self, prompts: list[list[int]]
    ) -> tuple[list[tuple[int, ...]], list[tuple[list[LayerKV], Any]]]:
        """Every distinct prompt read once: (the distinct prompts, their (KV, next-token
        logits)). Long prefixes that several share are read first, so each reads only its
        own tail after them."""
        if self.prefixes.max_tokens:
            self._read_prompts(self._shared_prefixes(prompts))
        distinct = list(dict.fromkeys(tuple(p) for p in prompts))
        return distinct, self._read_prompts([list(p) for p in distinct])

    def _read_prompts(self, prompts: list[list[int]]) -> list[tuple[list[LayerKV], Any]]:
        """(KV, next-token logits) of every prompt. Each reuses its longest cached prefix; the
        tails are read in batches of similar length (`READ_BATCH_TOKENS` padded tokens at
        most), and every prompt read is kept in the prefix cache."""
        lookups = [self.prefixes.longest_prefix(ids) for ids in prompts]
        prefixes = [layers or self._empty_kv() for _, layers in lookups]
        tails = [ids[reused:] for ids, (reused, _) in zip(prompts, lookups, strict=True)]
        results: list[Any] = [None] * len(prompts)
        for group in groups_by_length([len(t) for t in tails], READ_BATCH_TOKENS):
            batch = PromptBatch([prefixes[i] for i in group], [len(tails[i]) for i in group])
            with batch_attention(self.model):
                output = self.model(
                    input_ids=batch.input_ids([tails[i] for i in group], self.pad_id),
                    position_ids=batch.positions(),
                    use_cache=False,
                    kv_batch=batch,
                    logits_to_keep=batch.last_tokens(),
                )
            for row, index in enumerate(group):
                kv = batch.prompt_kv(row)
                self.prefixes.add(prompts[index], kv)
                results[index] = (kv, output.logits[row : row + 1, 0])
            self.stats.prefilled_tokens += sum(len(tails[i]) for i in group)
        return results

    def _empty_kv(self) -> list[LayerKV]:
        import torch

        config = self.model.config
        kv_heads = config.num_key_value_heads
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        empty = torch.empty(1, kv_heads, 0, head_dim, dtype=self.dtype, device=self.model.device)
        return [(empty, empty)] * config.num_hidden_layers

    def _shared_prefixes(self, prompts: list[list[int]]) -> list[list[int]]:
        """The long prefixes that several of these prompts share and that are not cached yet
        (sibling critiques differ only at the end): read first, each prompt then reads only
        its own tail. A shared prefix that a longer one extends is left out: by longest common
        prefix the longer one serves it too."""
        ordered = sorted(prompts)
        wanted: list[list[int]] = []
        for before, after in zip(ordered, ordered[1:], strict=False):
            shared = common_prefix_length(before, after)
            worth_it = MIN_SHARED_PREFIX <= shared < min(len(before), len(after))
            if worth_it and self.prefixes.longest_prefix(before[:shared])[0] < shared - 1:
                wanted.append(before[:shared])
        return [w for w in wanted if not any(len(o) > len(w) and o[: len(w)] == w for o in wanted)]


MIN_SHARED_PREFIX = 64  # tokens; shorter shared prefixes are not worth a separate read
READ_BATCH_TOKENS = 4096  # padded tail tokens read in one forward


def prepare_tokenizer(tokenizer: Any, model: str) -> None:
    """Left padding, a pad token, and a chat template (or ModelLoadError)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ModelLoadError(
            f"the tokenizer of {model} has no chat template",
            hint="use an instruction-tuned model (its tokenizer defines a chat template)",
        )


def encode_chat(
    tokenizer: Any, messages: Sequence[ChatMessage], prefix: str, max_tokens: int
) -> list[int]:
    """Token ids of the chat prompt (template + generation prompt + the answer's `prefix`),
    cut from the top to `max_tokens`."""
    rendered = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False,
        add_generation_prompt=True,
    )
    rendered += prefix
    ids: list[int] = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return ids[-max_tokens:]


def nf4_config(dtype: Any) -> Any:
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

    folder = require_adapter_dir(adapter)
    try:
        return PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot apply adapter {folder}: {exc}") from exc
