"""Where the base model of training and merging comes from: the same rule as inference
(`config.policy.model`: Hugging Face id | local folder | .gguf file | "smollm2")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codeq.errors import MissingInputError
from codeq.policy.source import announce_load, load_error


def check_adapter_dir(adapter_dir: str | Path) -> Path:
    """The adapter folder must hold a PEFT adapter config; raise MissingInputError otherwise."""
    path = Path(adapter_dir).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise MissingInputError(
            f"no LoRA adapter at {path} (adapter_config.json missing)",
            hint="run `codeq train` first and pass its adapter folder",
        )
    return path


def load_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise load_error(source, source, exc) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(source: str, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    announce_load(source, source)
    try:
        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise load_error(source, source, exc) from exc
