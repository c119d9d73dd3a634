"""Where the base model of training and merging comes from: the same rule as inference
(`config.policy.model`: Hugging Face id | local folder | .gguf file | "smollm2")."""

from __future__ import annotations

from typing import Any

from codeq.config import PolicyConfig
from codeq.policy.source import announce_load, load_error


def load_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise load_error(source, source, exc) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(source: str, dtype: Any, device: int | None = None) -> Any:
    """On CPU, or on CUDA device `device` (weights loaded straight onto it)."""
    from transformers import AutoModelForCausalLM

    announce_load(source, source)
    placement = {} if device is None else {"device_map": {"": device}}
    try:
        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **placement)
    except (OSError, ValueError) as exc:
        raise load_error(source, source, exc) from exc


def training_quantization(policy: PolicyConfig) -> str:
    """How training loads the base: as sampling does (policy.quantization on its device), so
    on CUDA an NF4-sampled policy is trained as QLoRA on the same NF4 weights."""
    from codeq.policy.engine import resolve_device, resolve_quantization

    return resolve_quantization(policy, resolve_device(policy))


def load_training_model(
    source: str, dtype: Any, quantization: str, device: int | None = None
) -> Any:
    """The base model DPO puts a LoRA on, on CUDA device `device` (this process's GPU; None: the
    CPU): plain weights in `dtype`, or 4-bit NF4 weights with `dtype` compute (QLoRA: peft's
    k-bit preparation keeps norms and the head in fp32), quantized on that device."""
    if quantization != "nf4":
        return load_causal_lm(source, dtype, device)
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    from codeq.policy.engine import nf4_config

    announce_load(source, source)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype,
            quantization_config=nf4_config(dtype),
            device_map={"": 0 if device is None else device},
        )
    except (OSError, ValueError) as exc:
        raise load_error(source, source, exc) from exc
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
