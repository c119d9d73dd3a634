"""What the learning curve's searches show about the policy: extraction failures, rewrites that
return the buggy program unchanged, syntax errors, rewrites cut off at the token budget, how
many distinct programs a task's rewrites are and on how many tasks one passes the search's
reward tests, and whether the self-critique score carries any signal about which rewrites pass.

Reads every evaluated policy's trajectories (finished or partial) under `--eval` (the folder
bench/learning_curve.py writes: <out>/eval/<policy>/trajectories-<mode>[.partial].jsonl) and
prints one table per policy; `--json` writes the same numbers for docs/results.md. With
`--tasks` (the test split's tasks) it also scores each task's returned program on all its tests,
exactly as `codeq evaluate` does, so modes that finished before the curve's evaluation of a
policy did have a solve rate (MCTS here is at its full budget; the per-budget figures come
from the curve's own results).

    python bench/curve_findings.py --eval codeq-runs/curve/eval --max-new-tokens 512 \
        --tasks codeq-runs/curve/work/tasks-test/test.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.pairs import critique_signal, normalize_whitespace  # noqa: E402
from codeq.schemas import Trajectory  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, required=True, help="<out>/eval of the curve")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="the curve's budget")
    parser.add_argument("--json", type=Path, help="write the findings here as JSON")
    parser.add_argument("--tasks", type=Path, help="test tasks: also score returned programs")
    return parser.parse_args()


def load_mode(folder: Path, mode: str) -> list[Trajectory]:
    """The finished file when there is one, else whatever whole lines the partial file holds."""
    for name in (f"trajectories-{mode}.jsonl", f"trajectories-{mode}.partial.jsonl"):
        path = folder / name
        if path.is_file():
            trajectories = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    trajectories.append(Trajectory.model_validate_json(line))
                except ValueError:
                    break
            return trajectories
    return []


def mode_findings(trajectories: list[Trajectory], max_new_tokens: int) -> dict[str, Any]:
    rewrites = [(t, node) for t in trajectories for node in t.nodes[1:]]
    statuses: dict[str, int] = {}
    unchanged = cut_off = 0
    for trajectory, node in rewrites:
        status = node.verdict.status if node.verdict else "not_extracted"
        statuses[status] = statuses.get(status, 0) + 1
        unchanged += node.program.strip() == trajectory.nodes[0].program.strip()
        cut_off += "```" not in node.completion.split("```", 1)[-1]
    signal = critique_signal(trajectories)
    n = max(len(rewrites), 1)
    distinct = [  # how different a task's rewrites are: DPO may narrow what sampling explores
        len({normalize_whitespace(node.program) for node in t.nodes[1:] if node.valid})
        for t in trajectories
    ]
    return {
        "tasks": len(trajectories),
        "rewrites": len(rewrites),
        "not_extracted": sum(not node.valid for _, node in rewrites) / n,
        "unchanged": unchanged / n,
        "distinct_programs_per_task": sum(distinct) / max(len(trajectories), 1),
        "rewrites_passing_reward_tests": statuses.get("passed", 0),
        "tasks_with_a_rewrite_passing_reward_tests": sum(
            any(node.verdict is not None and node.verdict.passed for node in t.nodes[1:])
            for t in trajectories
        ),
        "without_closing_fence": cut_off / n,
        "status": {key: value / n for key, value in sorted(statuses.items())},
        "completion_tokens_per_task": sum(t.completion_tokens for t in trajectories)
        / max(len(trajectories), 1),
        "seconds_per_task": sum(t.seconds for t in trajectories) / max(len(trajectories), 1),
        "critique_auc": signal.auc,
        "critique_scored": signal.passing + signal.failing,
        "max_new_tokens": max_new_tokens,
    }


def solve_rate(trajectories: list[Trajectory], tasks_path: Path, sandbox: Any) -> dict[str, Any]:
    """The returned program of each searched task, scored on visible + hidden tests."""
    from codeq.evaluate.run import final_program, fully_passed
    from codeq.evaluate.stats import rate
    from codeq.schemas import Task, read_jsonl

    by_id = {task.task_id: task for task in read_jsonl(tasks_path, Task)}
    tasks = [by_id[t.task_id] for t in trajectories]
    solved = fully_passed(tasks, [final_program(t) for t in trajectories], sandbox)
    return {**rate(sum(solved.values()), len(tasks), 0.95), "per_task": solved}


def findings(
    eval_root: Path, max_new_tokens: int, tasks_path: Path | None = None, sandbox: Any = None
) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for folder in sorted(p for p in eval_root.iterdir() if p.is_dir()):
        for mode in ("zero_shot", "full_rewrite", "mcts", "bon"):
            trajectories = load_mode(folder, mode)
            if trajectories:
                row = mode_findings(trajectories, max_new_tokens)
                if tasks_path is not None:
                    row["returned_program"] = solve_rate(trajectories, tasks_path, sandbox)
                found.setdefault(folder.name, {})[mode] = row
    return found


def table(found: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| policy | mode | tasks | rewrites | distinct a task | passing reward tests (tasks) "
        "| not extracted | unchanged | syntax error | no closing fence | critique AUC "
        "| solved (95% CI) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, modes in found.items():
        for mode, row in modes.items():
            auc = "n/a" if row["critique_auc"] is None else f"{row['critique_auc']:.2f}"
            scored = row.get("returned_program")
            solved = (
                f"{scored['solved']}/{scored['n']} ({scored['ci_low']:.0%}-{scored['ci_high']:.0%})"
                if scored
                else "not scored"
            )
            lines.append(
                f"| {policy} | {mode} | {row['tasks']} | {row['rewrites']} "
                f"| {row['distinct_programs_per_task']:.1f} "
                f"| {row['rewrites_passing_reward_tests']} "
                f"({row['tasks_with_a_rewrite_passing_reward_tests']}) "
                f"| {row['not_extracted']:.0%} | {row['unchanged']:.0%} "
                f"| {row['status'].get('syntax_error', 0.0):.0%} "
                f"| {row['without_closing_fence']:.0%} | {auc} | {solved} |"
            )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.tasks is None:
        found = findings(args.eval, args.max_new_tokens)
    else:
        from codeq.config import load_config
        from codeq.sandbox import Sandbox

        with Sandbox(load_config().sandbox) as sandbox:
            found = findings(args.eval, args.max_new_tokens, args.tasks, sandbox)
    print(table(found))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
