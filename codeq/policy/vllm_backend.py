"""The `vllm` backend: generation by vLLM (`pip install 'codeq[vllm]'`, CUDA only).

vLLM's `LLMEngine` is stepped like our stream: requests are added with `add_request` and every
`step()` advances them by one scheduler iteration. Prompts are our token ids (the same chat
encoding as every backend); each sample of a request is its own vLLM request, with its own seed
(`samples.sample_seed(seed, k)`, so a sample does not depend on what shares the batch) and the
same prompt, whose blocks automatic prefix caching computes once for all of them and keeps for
any later prompt that begins the same way (a critique continuing its rewrite: `keep_cache`
needs nothing more). vLLM stops at our EOS ids and the token budget; our other stop rules (the
closing fence, the score line) are checked on each step's tokens and the request is aborted
once one fires, its tokens after the stop not counted.

Quantization: 'none' loads the dtype's weights, 'nf4' is vLLM's in-flight bitsandbytes 4-bit
(NF4; in vLLM 0.30 through the vllm-bnb-plugin package the extra installs), 'fp8' vLLM's fp8
method (FP8 weights, dynamic activation scales; Hopper or Ada GPUs). A LoRA adapter
(policy.adapter) is applied per request (`LoRARequest`).

`USED_API` lists every name and argument of vLLM this module uses; the tests' fake implements
exactly these, and tests/test_vllm_backend.py checks them against the vllm source.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codeq.errors import ConfigError, ModelLoadError, StageFailedError
from codeq.policy.requests import (
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    complete_all,
)
from codeq.policy.samples import BackendStream, Sample, sample_seed
from codeq.policy.stopping import StopCondition, StopKind, eos_ids

if TYPE_CHECKING:
    from codeq.config import PolicyConfig

VLLM_VERSION = "0.30.0"  # the newest vLLM whose pins admit our lock (torch 2.13.0, transformers
# 5.23): 0.31 to 0.33 cap transformers below 5.21 (0.33 also moves to torch 2.14)
INSTALL_HINT = (
    f"pip install 'codeq[vllm]' (vLLM {VLLM_VERSION}, CUDA only; the CUDA infer image has it), or set "
    "policy.backend to 'engine' or 'transformers' (CODEQ_POLICY__BACKEND=engine)"
)
QUANTIZATION = {"none": None, "nf4": "bitsandbytes", "fp8": "fp8"}
GPU_MEMORY_UTILIZATION = 0.85  # leaves room for the sandbox-side processes and training's reload

# module path of each name -> the attributes or arguments of it this backend uses
USED_API: dict[str, tuple[str, ...]] = {
    "vllm.EngineArgs": (
        "model",
        "tokenizer",
        "dtype",
        "quantization",
        "seed",
        "enable_prefix_caching",
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "enable_lora",
        "max_lora_rank",
        "disable_log_stats",
    ),
    "vllm.LLMEngine": (
        "from_engine_args",
        "add_request",
        "step",
        "abort_request",
        "has_unfinished_requests",
        "reset_prefix_cache",
    ),
    "vllm.SamplingParams": (
        "n",
        "temperature",
        "top_p",
        "seed",
        "max_tokens",
        "stop_token_ids",
        "detokenize",
    ),
    "vllm.TokensPrompt": ("prompt_token_ids",),
    "vllm.RequestOutput": ("request_id", "outputs", "finished", "num_cached_tokens"),
    "vllm.CompletionOutput": ("token_ids",),
    "vllm.lora.request.LoRARequest": ("lora_name", "lora_int_id", "lora_path"),
}
# method -> (the parameters it is given by position, in order; those given by keyword)
USED_PARAMETERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vllm.LLMEngine.from_engine_args": (("engine_args",), ()),
    "vllm.LLMEngine.add_request": (("request_id", "prompt", "params"), ("lora_request",)),
    "vllm.LLMEngine.abort_request": (("request_ids",), ()),
}


def check_vllm(config: PolicyConfig) -> None:
    """ConfigError unless vLLM is installed and a CUDA GPU is there, before anything loads."""
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "policy.backend 'vllm' needs vLLM, which is not installed here", hint=INSTALL_HINT
        )
    if config.device == "cpu" or not torch.cuda.is_available():
        where = "policy.device is 'cpu'" if config.device == "cpu" else "no CUDA GPU is available"
        raise ConfigError(
            f"policy.backend 'vllm' needs a CUDA GPU, and {where}",
            hint="set policy.backend to 'engine' or 'transformers' (CODEQ_POLICY__BACKEND=engine)",
        )


def lora_rank(adapter: Path) -> int:
    try:
        return int(json.loads((adapter / "adapter_config.json").read_text())["r"])
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read the LoRA rank of {adapter}: {exc}") from exc


class VllmPolicy:
    """A policy whose requests vLLM generates. `engine` is a vLLM `LLMEngine` (or the tests'
    fake), `tokenizer` the model's Hugging Face tokenizer (prompts are encoded and texts
    decoded here, as every backend does)."""

    backend = "vllm"

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        *,
        name: str,
        batch_size: int,
        max_prompt_tokens: int,
        lora: Any = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.name = name
        self.device = "cuda"
        self.batch_size = batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.eos_ids = eos_ids(tokenizer)
        self.lora = lora
        self.stats = GenerationStats()
        self.owners: dict[str, tuple[VllmStream, Sample]] = {}
        self._next_id = 0

    @classmethod
    def load(
        cls,
        config: PolicyConfig,
        *,
        seed: int | None = None,
        gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    ) -> VllmPolicy:
        """Check vLLM and CUDA, then load the model into a vLLM engine as `config` says
        (`gpu_memory_utilization`: the share of the GPU vLLM takes for weights and cache; a
        benchmark that also holds the engine's copy of the model gives it less)."""
        check_vllm(config)
        from transformers import AutoTokenizer
        from vllm import EngineArgs, LLMEngine

        from codeq.policy.engine import prepare_tokenizer, resolve_dtype, resolve_quantization
        from codeq.policy.source import (
            announce_load,
            load_error,
            require_adapter_dir,
            resolve_model_source,
        )

        quantization = resolve_quantization(config, "cuda")
        dtype = str(resolve_dtype(config, "cuda")).removeprefix("torch.")
        path = resolve_model_source(config.model, config.cache_dir)
        adapter = require_adapter_dir(config.adapter) if config.adapter else None
        announce_load(config.model, path, "policy")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise load_error(config.model, path, exc) from exc
        prepare_tokenizer(tokenizer, config.model)
        arguments = EngineArgs(
            model=path,
            tokenizer=path,
            dtype=dtype,
            quantization=QUANTIZATION[quantization],
            seed=seed or 0,
            enable_prefix_caching=config.prefix_cache_tokens > 0,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=config.max_prompt_tokens + config.max_new_tokens,
            max_num_seqs=config.batch_size,
            enable_lora=adapter is not None,
            max_lora_rank=lora_rank(adapter) if adapter is not None else 16,
            disable_log_stats=True,
        )
        engine = LLMEngine.from_engine_args(arguments)
        lora = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            lora = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path=str(adapter))
        return cls(
            engine,
            tokenizer,
            name=config.model,
            batch_size=config.batch_size,
            max_prompt_tokens=config.max_prompt_tokens,
            lora=lora,
        )

    def encode_chat(self, messages: Any, prefix: str = "") -> list[int]:
        from codeq.policy.engine import encode_chat

        return encode_chat(self.tokenizer, messages, prefix, self.max_prompt_tokens)

    def stop_condition(self, kind: StopKind, prefix: str = "") -> StopCondition:
        return StopCondition(self.tokenizer, self.eos_ids, kind, prefix)

    def stream(self) -> VllmStream:
        return VllmStream(self)

    def generate(
        self, requests: Sequence[GenerationRequest], *, seed: int | None = None
    ) -> list[GenerationResult]:
        """Complete every request `n` times; order preserved. An unseeded request's samples
        draw from vLLM's own generator (`seed` is the engine's, set at load)."""
        return complete_all(self.stream(), requests)

    def clear_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def add(
        self, stream: VllmStream, ticket: int, request: GenerationRequest, prompt: list[int]
    ) -> None:
        """One vLLM request a sample, each with its own seed."""
        from vllm import SamplingParams, TokensPrompt

        for index in range(request.n):
            request_id = f"codeq{self._next_id}"
            self._next_id += 1
            stop = self.stop_condition(request.stop, request.prefix)
            self.owners[request_id] = (stream, Sample(ticket, index, stop, request.max_new_tokens))
            params = SamplingParams(
                n=1,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=None if request.seed is None else sample_seed(request.seed, index),
                max_tokens=request.max_new_tokens,
                stop_token_ids=sorted(self.eos_ids),
                detokenize=False,
            )
            self.engine.add_request(
                request_id,
                TokensPrompt(prompt_token_ids=prompt),
                params,
                lora_request=self.lora,
            )
        self.stats.prompt_tokens += len(prompt)

    def step(self) -> None:
        """One engine step; each sample whose stop rule fired is aborted and finished."""
        outputs = self.engine.step()
        self.stats.steps += 1
        for output in outputs:
            owner = self.owners.get(output.request_id)
            if owner is None:  # aborted after this step's outputs were made
                continue
            stream, sample = owner
            tokens = list(output.outputs[0].token_ids)
            if sample.fed == 0 and tokens and output.num_cached_tokens is not None:
                prompt = len(stream.pending[sample.ticket].prompt_ids)
                self.stats.prefilled_tokens += prompt - output.num_cached_tokens
            stopped = sample.feed(tokens)
            if stopped or output.finished:
                if not output.finished:
                    self.engine.abort_request([output.request_id])
                del self.owners[output.request_id]
                stream.sample_done(sample, tokens)
        if self.owners and not outputs and not self.engine.has_unfinished_requests():
            raise StageFailedError(
                f"vLLM has no request left but {len(self.owners)} samples are unfinished",
                hint="run with policy.backend 'engine' to compare",
            )


class VllmStream(BackendStream):
    """Requests in at any time, (ticket, result) out after any step (see ContinuousStream in
    transformers_backend.py: the same contract); one forward is one engine step."""

    def _add(self, ticket: int, request: GenerationRequest, prompt: list[int]) -> None:
        self.policy.add(self, ticket, request, prompt)

    def _forward(self) -> None:
        self.policy.step()
