"""DPO training benchmark, one run, ratios measured within it (timings on shared CPUs are noisy):

1. precision: seconds per optimizer step and real tokens/s of the default precision
   (bf16 weights, fp32 log-probs) against CodeQ's full fp32, same pairs, same batches;
2. padding: real/padded tokens over one epoch of training batches with and without length
   bucketing (the real collator and sampler, no training needed to count them);
3. held-out evaluation: seconds of --evaluations evaluations of the same held-out pairs with
   the reference's log-probabilities computed at the first and reused (the default) against
   computed at every one, and whether every evaluation's metrics are the same.

Model: SmolLM2-135M-Instruct (a realistic Llama shape) with the default LoRA (r=32, 7 modules).
Pairs: DebugBench items as (problem + buggy code) -> chosen oracle fix vs rejected buggy code.

    python bench/train.py [--steps 3] [--pairs 64] [--source DIR|builtin]
        [--parts precision,padding,evaluation] [--evaluations 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
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


def bench_config(precision: str, bucketing: bool, steps: int, eval_fraction: float = 0.0) -> Any:
    return load_config(
        overrides={
            "policy": {"model": os.environ.get("CODEQ_BENCH_MODEL", "smollm2")},
            "train": {
                "precision": precision,
                "length_bucketing": bucketing,
                "per_device_batch_size": 2,
                "gradient_accumulation_steps": 1,
                "max_steps": steps,
                "eval_fraction": eval_fraction,
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


def timed_evaluations(pairs: list[Pair], reuse: bool, evaluations: int, work: Path) -> dict:
    """`evaluations` evaluations of one trainer's held-out pairs, timed together, with the
    reference's log-probabilities reused after the first (as train does) or computed each time."""
    from codeq.train import dpo

    dpo.REUSE_REFERENCE_IN_EVAL = reuse
    try:
        prepared = build_trainer(pairs, work, bench_config("bf16", True, 1, eval_fraction=0.25))
        began = time.perf_counter()
        metrics = [prepared.trainer.evaluate() for _ in range(evaluations)]
        seconds = time.perf_counter() - began
    finally:
        dpo.REUSE_REFERENCE_IN_EVAL = True
    timing = (
        "eval_runtime",
        "eval_samples_per_second",
        "eval_steps_per_second",
        "eval_model_preparation_time",
    )
    return {
        "reuse_reference": reuse,
        "held_out_pairs": prepared.n_held_out,
        "evaluations": evaluations,
        "seconds": seconds,
        "metrics": [{k: v for k, v in m.items() if k not in timing} for m in metrics],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per precision")
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--max-chars", type=int, default=1400, help="skip longer items")
    parser.add_argument(
        "--source", default=str(DEFAULT_SOURCE) if DEFAULT_SOURCE.is_dir() else "builtin"
    )
    parser.add_argument(
        "--parts",
        default="precision,padding,evaluation",
        help="which measurements, comma-separated (precision, padding, evaluation)",
    )
    parser.add_argument("--evaluations", type=int, default=4, help="held-out evaluations timed")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    pairs = oracle_pairs(args.source, args.pairs, args.max_chars)
    print(f"[bench] {len(pairs)} pairs from {args.source}", file=sys.stderr)
    report: dict[str, Any] = {"pairs": len(pairs)}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "padding" in parts:
            padding = {
                "bucketed": padding_ratio(pairs, True, work),
                "unbucketed": padding_ratio(pairs, False, work),
            }
            report["padding"] = padding
            lines.append(
                f"real/padded tokens: {padding['bucketed']['ratio']:.3f} bucketed, "
                f"{padding['unbucketed']['ratio']:.3f} unbucketed"
            )
        if "precision" in parts:
            default = timed_run(pairs, "bf16", args.steps, work)
            full = timed_run(pairs, "fp32", args.steps, work)
            speedup = full["seconds_per_step"] / default["seconds_per_step"]
            report |= {
                "default_precision": default,
                "full_fp32": full,
                "speedup_default_vs_fp32": speedup,
                "tokens_per_second_ratio": default["real_tokens_per_second"]
                / full["real_tokens_per_second"],
            }
            lines.append(
                f"default precision (bf16, fp32 log-probs) vs full fp32: {speedup:.2f}x step "
                f"speed ({default['seconds_per_step']:.2f}s vs {full['seconds_per_step']:.2f}s "
                "per step)"
            )
        if "evaluation" in parts:
            reused = timed_evaluations(pairs, True, args.evaluations, work)
            every = timed_evaluations(pairs, False, args.evaluations, work)
            same = reused["metrics"] == every["metrics"]
            ratio = every["seconds"] / reused["seconds"]
            report["evaluation"] = {
                "reused": reused,
                "computed_each_time": every,
                "speedup": ratio,
                "same_metrics": same,
            }
            lines.append(
                f"{args.evaluations} held-out evaluations of {reused['held_out_pairs']} pairs, "
                f"reference reused vs computed each time: {ratio:.2f}x "
                f"({reused['seconds']:.1f}s vs {every['seconds']:.1f}s), same metrics: {same}"
            )
    report["command"] = "python bench/train.py " + " ".join(sys.argv[1:])
    report["summary"] = lines
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
