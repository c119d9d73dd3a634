"""Does a resumed search write the same trees as one uninterrupted search?

Searches the first `--tasks-count` tasks of a tasks file twice without interruption, then
resumes the same search with the first `--skip` tasks already done (as a collect or evaluate
resumed after a crash does: `run_search(..., done=...)`), with the learning curve's settings
(MCTS, `search.deterministic` on) but `--parallel-trees` trees a group, and prints per resumed
task whether its tree (completions, programs, critiques, verdicts) is identical to the
uninterrupted run's. With 8 tasks, groups of 4 and 5 done, the resumed run skips the first
group and searches the second whole again, so it compares 3 trees searched without the group
before them. Minutes on CPU with Qwen2.5-Coder-0.5B:

    OMP_WAIT_POLICY=ACTIVE python bench/resume_determinism.py --tasks TRAIN.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, required=True, help="a prepared tasks .jsonl")
    parser.add_argument("--tasks-count", type=int, default=8)
    parser.add_argument("--skip", type=int, default=5, help="tasks a resumed search has done")
    parser.add_argument(
        "--parallel-trees",
        type=int,
        default=4,
        help="trees a group (the curve's 16 would put 8 tasks in one group, searched whole)",
    )
    parser.add_argument("--model", default=None, help="default: the curve's Qwen GGUF")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the curve's")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import learning_curve

    from codeq.config import load_config
    from codeq.policy import PolicyEngine
    from codeq.sandbox import Sandbox
    from codeq.schemas import Task, read_jsonl
    from codeq.search import run_search

    curve_args = learning_curve.parse_args(["--model", args.model] if args.model else [])
    settings = learning_curve.curve_settings(curve_args)
    if args.max_new_tokens:
        settings["policy"]["max_new_tokens"] = args.max_new_tokens
    settings["search"]["parallel_trees"] = args.parallel_trees
    config = load_config(None, settings).derive(search={"mode": "mcts"})
    tasks = read_jsonl(args.tasks, Task)[: args.tasks_count]
    engine = PolicyEngine.load(config.policy, seed=config.tasks.seed)

    def trees(searched: list) -> dict[str, list]:
        return {
            t.task_id: [
                (n.parent, n.completion, n.program, n.critique, n.verdict and n.verdict.passed)
                for n in t.nodes
            ]
            for t in searched
        }

    runs: dict[str, dict[str, list]] = {}
    with Sandbox(config.sandbox) as sandbox:
        done = {task.task_id for task in tasks[: args.skip]}
        for name, skipped in (("whole", set()), ("again", set()), ("resumed", done)):
            began = time.perf_counter()
            runs[name] = trees(run_search(tasks, engine, sandbox, config, done=skipped))
            took = time.perf_counter() - began
            print(f"{name}: {len(tasks) - len(skipped)} tasks, {took:.0f} s", flush=True)
    resumed = {i: runs["whole"][i] == runs["resumed"][i] for i in runs["resumed"]}
    result = {
        "tasks": len(tasks),
        "parallel_trees": args.parallel_trees,
        "uninterrupted_twice_identical": runs["whole"] == runs["again"],
        "resumed_identical_per_task": resumed,
        "resumed_identical": sum(resumed.values()),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
