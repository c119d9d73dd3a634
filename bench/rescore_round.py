"""Do a committed round's programs score the same on tasks this machine prepared?

Reads every program a committed learning-curve round's collect wrote (its trajectories, from
`<results>/rounds/round-N/`), scores each again in the sandbox on the tests it was scored on,
with the tasks in `--tasks` (the round's train file as this machine's prepare built it), and
compares each test's pass or fail with the recorded verdict. Used when prepare rebuilt a
finished round's train file with another sha256 for the same tasks (a loaded machine keeps
other generated hidden tests): no differing test says the rebuilt tasks judge that round's
programs alike. Seconds on 2 cores:

    python bench/rescore_round.py --results docs/results/learning-curve-defaults --round 6 \\
        --tasks /work/curve-defaults/store/runs/curve-lr0.0001/round-6/tasks/train.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import curve_rounds  # noqa: E402  (bench/ is not a package)


def committed_trees(folder: Path) -> list[dict]:
    """Every tree of the round's collect (all runs' trajectories it lists)."""
    entry = json.loads((folder / curve_rounds.ROUND_FILE).read_text())
    trees = []
    for key, recorded in sorted(entry["keys"].items()):
        if key.endswith("/trajectories/shard-0/trajectories.jsonl"):
            lines = curve_rounds.committed_content(folder, key, recorded).decode().splitlines()
            trees.extend(json.loads(line) for line in lines if line.strip())
    return trees


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="the curve's results folder")
    parser.add_argument("--round", type=int, required=True)
    parser.add_argument("--tasks", type=Path, required=True, help="this machine's train.jsonl")
    parser.add_argument("--out", type=Path, help="write the comparison here as JSON")
    args = parser.parse_args()

    from codeq.sandbox.pool import Sandbox
    from codeq.schemas import Task, read_jsonl
    from codeq.tasks.scoring import score_programs

    tasks = {task.task_id: task for task in read_jsonl(args.tasks, Task)}
    folder = args.results / curve_rounds.ROUNDS_DIR / f"round-{args.round}"
    trees = committed_trees(folder)
    scored: dict[str, list] = {}  # reward tests -> [(task id, recorded passes, task, program)]
    for tree in trees:
        for node in tree["nodes"]:
            if node.get("verdict"):
                passes = [test["passed"] for test in node["verdict"]["tests"]]
                item = (tree["task_id"], passes, tasks[tree["task_id"]], node["program"])
                scored.setdefault(tree["reward_tests"], []).append(item)
    differing: dict[str, int] = {}
    with Sandbox() as sandbox:
        for which, items in scored.items():
            verdicts = score_programs(
                [(task, program) for _, _, task, program in items], which, sandbox
            )
            for (task_id, recorded, _, _), verdict in zip(items, verdicts, strict=True):
                if [test.passed for test in verdict.tests] != recorded:
                    differing[task_id] = differing.get(task_id, 0) + 1
    result = {
        "round": args.round,
        "tasks_file_sha256": hashlib.sha256(args.tasks.read_bytes()).hexdigest(),
        "trees": len(trees),
        "programs": sum(len(items) for items in scored.values()),
        "programs_scored_otherwise": sum(differing.values()),
        "tasks_with_programs_scored_otherwise": differing,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
