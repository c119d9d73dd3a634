"""DPO on the real SmolLM2-135M: repair pairs from DebugBench (the correct program chosen over the
buggy one) must teach a preference that holds on held-out tasks (reward accuracy > 0.5)."""

from __future__ import annotations

import math

import pytest

from codeq.config import load_config
from codeq.schemas import ChatMessage, Pair, write_jsonl
from codeq.tasks import load_source


def repair_pairs(debugbench_dir, count: int, max_chars: int = 420) -> list[Pair]:
    items = [
        item
        for item in load_source(str(debugbench_dir))
        if len(item.oracle_code) < max_chars
        and len(item.buggy_code) < max_chars
        and item.oracle_code.strip() != item.buggy_code.strip()
    ]
    items.sort(key=lambda item: (item.slug, item.subtype))
    pairs = []
    for item in items[:count]:
        prompt = [
            ChatMessage(
                role="user",
                content=f"Fix the bug:\n```python\n{item.buggy_code.strip()}\n```",
            )
        ]
        pairs.append(
            Pair(
                task_id=item.slug,
                slug=item.slug,
                level=item.level,  # type: ignore[arg-type]
                category=item.category,  # type: ignore[arg-type]
                prompt=prompt,
                chosen=f"```python\n{item.oracle_code.strip()}\n```",
                rejected=f"```python\n{item.buggy_code.strip()}\n```",
                q_chosen=1.0,
                q_rejected=0.0,
            )
        )
    return pairs


@pytest.mark.slow
def test_smollm2_dpo_raises_heldout_reward_accuracy(tmp_path, smollm2_dir, debugbench_dir) -> None:
    from codeq.train import train_dpo

    pairs = repair_pairs(debugbench_dir, 48)
    assert len(pairs) >= 40
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    config = load_config(
        overrides={
            "policy": {"model": str(smollm2_dir)},
            "train": {
                "lora_r": 8,
                "lora_alpha": 16,
                "learning_rate": 5e-4,
                "per_device_batch_size": 2,
                "gradient_accumulation_steps": 1,
                "max_steps": 6,
                "eval_steps": 3,
                "eval_fraction": 0.2,
                "max_length": 512,
                "precision": "fp32",  # bf16 takes twice the time on a CPU without AMX
            },
        }
    )
    metrics = train_dpo(tmp_path / "pairs.jsonl", tmp_path / "out", config)

    assert metrics["pairs"]["held_out"] >= 8
    assert all(math.isfinite(step["loss"]) for step in metrics["steps"])
    assert metrics["heldout_reward_accuracy"] > 0.5
    assert metrics["heldout_reward_accuracy_final"] > 0.5
    assert (tmp_path / "out" / "adapter" / "adapter_model.safetensors").is_file()
