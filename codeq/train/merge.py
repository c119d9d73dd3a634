"""Fold a LoRA adapter into its base model (merge_and_unload) so the next round's inference loads
one plain model folder."""

from __future__ import annotations

import sys
from pathlib import Path

from codeq.config import CodeQConfig
from codeq.errors import ModelLoadError
from codeq.train.model import check_adapter_dir, load_causal_lm, load_tokenizer


def merge_adapter(
    base: str, adapter_dir: str | Path, out_dir: str | Path, config: CodeQConfig
) -> Path:
    """Merge `adapter_dir` into `base` (a folder or HF id, as resolved from policy.model) and save
    the merged model with its tokenizer to `out_dir` as safetensors; returns out_dir."""
    import torch
    from peft import PeftModel

    adapter_path = check_adapter_dir(adapter_dir)
    out_path = Path(out_dir)
    dtype = torch.bfloat16 if config.train.precision == "bf16" else torch.float32
    print(f"[merge] {adapter_path} into {base}", file=sys.stderr, flush=True)
    model = load_causal_lm(base, dtype)
    try:
        peft_model = PeftModel.from_pretrained(model, str(adapter_path))
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ModelLoadError(
            f"adapter {adapter_path} does not fit base model {base}: {exc}".splitlines()[0],
            hint="merge into the same base model the adapter was trained on",
        ) from exc
    merged = peft_model.merge_and_unload()
    out_path.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out_path), safe_serialization=True)
    load_tokenizer(base).save_pretrained(str(out_path))
    return out_path
