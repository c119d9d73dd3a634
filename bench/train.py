"""DPO training benchmark, one run, ratios measured within it (timings on shared CPUs are noisy):

1. precision: seconds per optimizer step and real tokens/s of the default precision
   (bf16 weights, fp32 log-probs) against CodeQ's full fp32, same pairs, same batches;
2. padding: real/padded tokens over one epoch of training batches with and without length
   bucketing (the real collator and sampler, no training needed to count them).

Model: SmolLM2-135M-Instruct (a realistic Llama shape) with the default LoRA (r=32, 7 modules).
Pairs: DebugBench items as (problem + buggy code) -> chosen oracle fix vs rejected buggy code.

    python bench/train.py [--steps 3] [--pairs 64] [--source DIR|builtin]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from codeq.config import load_config
from codeq.schemas import ChatMessage, Pair
from codeq.tasks import load_source
from codeq.train.dpo import PaddingMeter, build_trainer

DEFAULT_SOURCE = Path(__file__).resolve().parent.parent.parent / "shared" / "debugbench"


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def oracle_pairs(source: str, count: int, max_chars: int) -> list[Pair]:
    """Repair pairs: the correct program is chosen over the buggy one, for short items."""
    items = [
        item
        for item in load_source(source)
        if len(item.description) + 2 * len(item.oracle_code) < max_chars
        and item.oracle_code.strip() != item.buggy_code.strip()
    ]
    items.sort(key=lambda item: (item.slug, item.subtype))
    pairs = []
    for item in items[:count]:
        prompt = [
            ChatMessage(role="system", content="You fix buggy Python programs."),
            ChatMessage(
                role="user",
                content=f"{item.description.strip()}\n\nBuggy code:\n{fenced(item.buggy_code)}\n\n"
                "Return the whole fixed program in one code block.",
            ),
        ]
        pairs.append(
            Pair(
                task_id=f"{item.slug}:{item.subtype}",
                slug=item.slug,
                level=item.level,  # type: ignore[arg-type]
                category=item.category,  # type: ignore[arg-type]
                prompt=prompt,
                chosen=fenced(item.oracle_code),
                rejected=fenced(item.buggy_code),
                q_chosen=1.0,
                q_rejected=0.0,
            )
        )
    return pairs


def bench_config(precision: str, bucketing: bool, steps: int) -> Any:
    return load_config(
        overrides={
            "policy": {"model": os.environ.get("CODEQ_BENCH_MODEL", "smollm2")},
            "train": {
                "precision": precision,
                "length_bucketing": bucketing,
                "per_device_batch_size": 2,
                "gradient_accumulation_steps": 1,
                "max_steps": steps,
                "eval_fraction": 0.0,
                "max_length": 1024,
                "learning_rate": 1e-4,
            },
        }
    )


def padding_ratio(pairs: list[Pair], bucketing: bool, work: Path) -> dict[str, Any]:
    prepared = build_trainer(pairs, work, bench_config("bf16", bucketing, 1))
    meter = PaddingMeter.of(prepared.trainer.get_train_dataloader())
    return {"real": meter.real_tokens, "padded": meter.padded_tokens, "ratio": meter.ratio}


def timed_run(pairs: list[Pair], precision: str, steps: int, work: Path) -> dict[str, Any]:
    prepared = build_trainer(pairs, work, bench_config(precision, True, steps + 1))
    trainer = prepared.trainer
    trainer.train()
    step_seconds = prepared.callback.step_seconds[1:]  # the first step warms up kernels
    meter: PaddingMeter = trainer.train_meter
    real_per_step = meter.real_tokens / max(1, len(prepared.callback.step_seconds))
    seconds = statistics.median(step_seconds)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "precision": precision,
        "seconds_per_step": seconds,
        "real_tokens_per_second": real_per_step / seconds,
        "losses": losses,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per precision")
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--max-chars", type=int, default=1400, help="skip longer items")
    parser.add_argument(
        "--source", default=str(DEFAULT_SOURCE) if DEFAULT_SOURCE.is_dir() else "builtin"
    )
    args = parser.parse_args()

    pairs = oracle_pairs(args.source, args.pairs, args.max_chars)
    print(f"[bench] {len(pairs)} pairs from {args.source}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        padding = {
            "bucketed": padding_ratio(pairs, True, work),
            "unbucketed": padding_ratio(pairs, False, work),
        }
        default = timed_run(pairs, "bf16", args.steps, work)
        full = timed_run(pairs, "fp32", args.steps, work)

    speedup = full["seconds_per_step"] / default["seconds_per_step"]
    report = {
        "pairs": len(pairs),
        "default_precision": default,
        "full_fp32": full,
        "speedup_default_vs_fp32": speedup,
        "tokens_per_second_ratio": default["real_tokens_per_second"]
        / full["real_tokens_per_second"],
        "padding": padding,
    }
    print(json.dumps(report, indent=2))
    print(
        f"default precision (bf16, fp32 log-probs) vs full fp32: {speedup:.2f}x step speed "
        f"({default['seconds_per_step']:.2f}s vs {full['seconds_per_step']:.2f}s per step); "
        f"real/padded tokens: {padding['bucketed']['ratio']:.3f} bucketed, "
        f"{padding['unbucketed']['ratio']:.3f} unbucketed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
