"""Fold LoRA adapters into their base model (merge_and_unload) so the next round's inference and
training load one plain model folder."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.errors import ModelLoadError
from codeq.policy.source import require_adapter_dir
from codeq.train.model import load_causal_lm, load_tokenizer

log = logging.getLogger(__name__)


def merge_adapters(
    base: str, adapter_dirs: Sequence[str | Path], out_dir: str | Path, save_dtype: Any
) -> Path:
    """Merge each adapter, in order, into `base` (weights held in fp32 while merging, so small
    updates are not rounded away between adapters) and save the result with its tokenizer to
    `out_dir` as safetensors in `save_dtype`. The folder appears whole or not at all."""
    import torch
    from peft import PeftModel

    folders = [require_adapter_dir(folder) for folder in adapter_dirs]
    log.info("merging %s into %s", ", ".join(map(str, folders)), base)
    model = load_causal_lm(base, torch.float32)
    for folder in folders:
        try:
            model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
        except (ValueError, RuntimeError, KeyError) as exc:
            raise ModelLoadError(
                f"adapter {folder} does not fit base model {base}: {exc}".splitlines()[0],
                hint="merge into the same base model the adapter was trained on",
            ) from exc
    target = Path(out_dir)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.to(save_dtype).save_pretrained(str(staging), safe_serialization=True)
    load_tokenizer(base).save_pretrained(str(staging))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def merge_adapter(
    base: str, adapter_dir: str | Path, out_dir: str | Path, config: CodeQConfig
) -> Path:
    """`codeq merge`: one adapter into `base`, saved in the training precision's dtype."""
    import torch

    dtype = torch.bfloat16 if config.train.precision == "bf16" else torch.float32
    return merge_adapters(base, [adapter_dir], out_dir, dtype)
