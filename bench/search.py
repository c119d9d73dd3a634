"""Batched multi-tree search against one tree at a time, same settings, one run.

Both conditions search the same tasks with the same model, K, rollouts, token budgets and
sandbox; the only difference is `search.parallel_trees` (how many task trees are advanced
together, so how many sequences share one generate call). Each run starts with an empty prefix
cache, so neither reuses prompts the other read. Runs go in the order batched, single, single,
batched (`--repeats 2`, the default) so a machine that speeds up or slows down during the bench
weighs on both alike. Prints completion tokens/s, tasks/hour and the ratio.

    python bench/search.py                      # SmolLM2-135M, 16 builtin tasks, K=2, 2 rollouts
    python bench/search.py --tasks tasks/train.jsonl --n-tasks 8 --json bench-search.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="policy model (default smollm2)")
    parser.add_argument("--tasks", help="tasks JSONL; default: the builtin tasks, prepared now")
    parser.add_argument("--n-tasks", type=int, default=16)
    parser.add_argument("--k", type=int, default=2, help="rewrites per expansion")
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--critique-tokens", type=int, default=24)
    parser.add_argument("--parallel-trees", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs per condition, in ABBA order (default 2)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch default; 1 on a busy CPU)",
    )
    parser.add_argument("--json", help="also write the numbers here")
    return parser.parse_args()


def load_tasks(args: argparse.Namespace, config: Any) -> list[Any]:
    from codeq.schemas import Task, read_jsonl

    if args.tasks:
        return read_jsonl(args.tasks, Task)[: args.n_tasks]
    from codeq.tasks import prepare

    out = Path(tempfile.mkdtemp(prefix="bench-search-"))
    prepare("builtin", out, config, progress=False)
    tasks = read_jsonl(out / "train.jsonl", Task) + read_jsonl(out / "test.jsonl", Task)
    return tasks[: args.n_tasks]


def measure(
    label: str, tasks: list[Any], engine: Any, sandbox: Any, config: Any, seed: int
) -> dict:
    import torch

    from codeq.search import run_search

    torch.manual_seed(seed)
    engine.clear_prefix_cache()  # cold: nothing read by an earlier run is reused
    stats = engine.stats
    before = stats.steps, stats.step_rows, stats.seconds, stats.prompt_tokens
    prefilled_before = stats.prefilled_tokens
    started = time.perf_counter()
    trajectories = run_search(tasks, engine, sandbox, config.derive(search={"mode": "mcts"}))
    seconds = time.perf_counter() - started
    steps = engine.stats.steps - before[0]
    rows = engine.stats.step_rows - before[1]
    generating = engine.stats.seconds - before[2]
    completion = sum(t.completion_tokens for t in trajectories)
    result = {
        "label": label,
        "parallel_trees": config.search.parallel_trees,
        "tasks": len(trajectories),
        "seconds": round(seconds, 2),
        "completion_tokens": completion,
        "prompt_tokens": sum(t.prompt_tokens for t in trajectories),
        "prompt_tokens_read": stats.prefilled_tokens - prefilled_before,
        "prompt_tokens_requested": stats.prompt_tokens - before[3],
        "tokens_per_s": round(completion / seconds, 2),
        "tasks_per_hour": round(len(trajectories) / seconds * 3600, 1),
        "generate_seconds": round(generating, 2),
        "generation_tokens_per_s": round(completion / generating, 2) if generating else 0.0,
        "decode_steps": steps,
        "mean_live_rows": round(rows / steps, 2) if steps else 0.0,
        "solved": sum(t.solved for t in trajectories),
    }
    print(
        f"{label:>22}: {result['tokens_per_s']:8.1f} tok/s  {result['tasks_per_hour']:8.1f} "
        f"tasks/h  ({completion} tokens, {seconds:.1f}s of which {generating:.1f}s in generate, "
        f"{result['mean_live_rows']} live rows a step, prompt tokens read "
        f"{result['prompt_tokens_read']} of {result['prompt_tokens_requested']})",
        flush=True,
    )
    return result


def combined(results: list[dict]) -> dict:
    """One condition over its runs: totals of tokens, tasks and seconds."""
    seconds = sum(r["seconds"] for r in results)
    tokens = sum(r["completion_tokens"] for r in results)
    tasks = sum(r["tasks"] for r in results)
    return {
        "runs": len(results),
        "seconds": round(seconds, 2),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2),
        "tasks_per_hour": round(tasks / seconds * 3600, 1),
        "prompt_tokens_read": sum(r["prompt_tokens_read"] for r in results),
        "prompt_tokens_requested": sum(r["prompt_tokens_requested"] for r in results),
    }


def main() -> None:
    args = parse_args()
    from codeq.config import load_config
    from codeq.policy import PolicyEngine
    from codeq.sandbox import Sandbox

    overrides = {
        "policy": {
            "model": args.model,
            "max_new_tokens": args.max_new_tokens,
            "critique_max_new_tokens": args.critique_tokens,
            "batch_size": max(16, args.parallel_trees * args.k),
            "cpu_threads": args.threads,
        },
        "search": {
            "rewrites_per_expansion": args.k,
            "rollouts": args.rollouts,
            "stop_on_pass": False,  # identical work per task in both runs
            "parallel_trees": args.parallel_trees,
        },
    }
    config = load_config(None, overrides)
    tasks = load_tasks(args, config)
    engine = PolicyEngine.load(config.policy, seed=args.seed)
    print(
        f"search bench: {args.model} on {engine.device} ({engine.dtype}), {len(tasks)} tasks, "
        f"K={args.k}, rollouts={args.rollouts}, max_new_tokens={args.max_new_tokens}",
        flush=True,
    )
    one_tree = load_config(
        None, {**overrides, "search": {**overrides["search"], "parallel_trees": 1}}
    )
    runs: dict[str, list[dict]] = {"batched": [], "single": []}
    order = (["batched", "single", "single", "batched"] * args.repeats)[: 2 * args.repeats]
    with Sandbox(config.sandbox) as sandbox:
        measure("warm-up", tasks[:1], engine, sandbox, one_tree, args.seed)
        for index, condition in enumerate(order):
            if condition == "batched":
                label, settings = f"{args.parallel_trees} trees together", config
            else:
                label, settings = "one tree at a time", one_tree
            result = measure(label, tasks, engine, sandbox, settings, args.seed + index)
            runs[condition].append(result)
    batched, single = combined(runs["batched"]), combined(runs["single"])
    ratio = batched["tokens_per_s"] / single["tokens_per_s"]
    task_ratio = batched["tasks_per_hour"] / single["tasks_per_hour"]
    print(
        f"ratio (batched / one tree at a time, {args.repeats} run(s) each): "
        f"{ratio:.2f}x tokens/s, {task_ratio:.2f}x tasks/h"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "batched": batched,
                    "single": single,
                    "runs": runs,
                    "ratio_tokens_per_s": ratio,
                    "ratio_tasks_per_hour": task_ratio,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
