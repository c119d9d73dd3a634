"""Multi-turn best-of-N against best-of-N at equal programs, on validation tasks (never test).

One `codeq evaluate` of the base policy with modes [bon, mt_bon] on the first --max-tasks tasks of
a validation file: multi-turn best-of-N with N samples a turn read at every turn budget t, paired
on the same tasks with best-of-(N x t) from one best-of-N run (the first N x t of its samples).
Both choose their answer the same way (visible tests, then the self-critique), and both answers
are scored on every test of the task (visible + hidden). Prints one row per budget (solved, tasks
gained and lost by mt_bon, the exact one-sided McNemar p that mt_bon is better, programs written)
and writes them with the settings to --json.

    python bench/mt_bon_vs_bon.py \
        --tasks /work/curve-defaults/store/runs/curve/round-0/tasks/validation.jsonl \
        --model ~/.cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --max-tasks 20 --samples 4 --turns 3 --out codeq-runs/mt-bon-vs-bon \
        --json docs/results/mt-bon/mt_bon_vs_bon.json

The evaluation resumes: run the same command again after an interruption.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.config import CodeQConfig, load_config  # noqa: E402


def bench_config(args: argparse.Namespace) -> CodeQConfig:
    """The defaults with the learning curve's generation settings (docs/results.md) and the
    two searches sized so best-of-N holds N x t samples for every turn budget t."""
    return load_config(
        None,
        {
            "policy": {
                "model": args.model,
                "max_new_tokens": args.max_new_tokens,
                "critique_max_new_tokens": 24,
                "batch_size": 32,
                "cpu_threads": args.cpu_threads,
            },
            "search": {
                "mt_bon_samples": args.samples,
                "mt_bon_turns": args.turns,
                "bon_samples": args.samples * args.turns,
                # MCTS is not run; these keep best-of-N's sizes to the multi-turn budgets
                "rewrites_per_expansion": args.samples,
                "rollouts": 1,
                "parallel_trees": args.max_tasks,
                "seed": args.seed,
            },
            "evaluate": {
                "modes": ["bon", "mt_bon"],
                "rollout_ablation": [1],
                "max_tasks": args.max_tasks,
            },
        },
    )


def rows(results: Any, samples: int) -> list[dict[str, Any]]:
    """mt_bon at t turns against best-of-(N x t), paired on the same tasks."""
    from codeq.promotion import compare_modes

    table = []
    for turns, multi in sorted(results.mt_bon_ablation.items(), key=lambda item: int(item[0])):
        size = str(samples * int(turns))
        bon = results.bon_ablation[size]
        paired = compare_modes(f"mt_bon@{samples}x{turns} vs bon@{size}", multi, bon)
        table.append(
            {
                **paired.model_dump(),
                "mt_bon_solved": multi.solved,
                "bon_solved": bon.solved,
                "mt_bon_programs": round(multi.programs, 2),
                "bon_programs": round(bon.programs, 2),
            }
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, required=True, help="a validation.jsonl")
    parser.add_argument("--model", required=True, help="policy.model (a .gguf file, a folder)")
    parser.add_argument("--max-tasks", type=int, default=20)
    parser.add_argument("--samples", type=int, default=4, help="N: samples a turn")
    parser.add_argument("--turns", type=int, default=3, help="T: turns at most")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--cpu-threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("codeq-runs/mt-bon-vs-bon"))
    parser.add_argument("--json", type=Path, help="also write the rows and settings here")
    args = parser.parse_args()
    if not args.tasks.name.startswith("validation"):
        raise SystemExit("error: compare search modes on a validation file, never on test tasks")

    from codeq.evaluate import evaluate

    config = bench_config(args)
    started = time.perf_counter()
    results = evaluate(args.tasks, args.out, config, split="validation")
    table = rows(results, args.samples)
    print("| figure | tasks | mt_bon | bon | gained / lost (p) | programs |")
    print("|---|---|---|---|---|---|")
    for row in table:
        print(
            f"| {row['mode']} | {row['tasks']} | {row['mt_bon_solved']} | {row['bon_solved']} | "
            f"+{len(row['gained'])} / -{len(row['lost'])} (p = {row['p_better']:.3g}) | "
            f"{row['mt_bon_programs']} vs {row['bon_programs']} |"
        )
    if args.json is not None:
        from codeq.schemas import write_json

        searches = {
            mode: {
                key: getattr(results.modes[mode], key)
                for key in ("completion_tokens", "prompt_tokens", "seconds")
            }
            for mode in ("bon", "mt_bon")
        }
        write_json(
            args.json,
            {
                "command": "python " + " ".join(sys.argv),
                "split": results.split,
                "task_ids": results.task_ids,
                "model": config.policy.model,
                "samples_per_turn": args.samples,
                "turns": args.turns,
                "search": config.search.model_dump(mode="json"),
                "policy": config.policy.model_dump(mode="json"),
                "rows": table,
                "searches": searches,
                "per_task": {
                    "mt_bon": {t: r.per_task for t, r in results.mt_bon_ablation.items()},
                    "bon": {n: r.per_task for n, r in results.bon_ablation.items()},
                },
                "wall_seconds": round(time.perf_counter() - started, 1),
            },
            indent=1,
        )


if __name__ == "__main__":
    main()
