"""The learned verifier on real data: trained on the programs a real round-0 collect wrote
(labels from all the train tasks' tests), measured by its AUC on the programs the evaluate stage
wrote on validation tasks (each run on all its tests in the sandbox), beside the self-critique's
AUC on held-out train problems (the validation rewrites of single-answer modes carry no
critique). Reads a store, never writes it; writes one JSON file with the command that made it.

    python bench/verifier_auc.py --store /work/curve-defaults/store --train-run curve \
        --eval-run curve-lr0.0001 --round 0 \
        --model ~/.cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --json docs/results/verifier/qwen-0.5b-round-0.json

--max-train-programs / --max-validation-programs / --max-length size a smoke run.

Resumable: every --checkpoint-every-s seconds training keeps a checkpoint under
<work>/progress; the same command run again (after a kill, or on another machine with <work>
copied) continues from the last one. One made with other arguments is refused.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.config import CodeQConfig  # noqa: E402
from codeq.pairs import read_trajectories  # noqa: E402
from codeq.schemas import Task, Trajectory, read_jsonl  # noqa: E402
from codeq.verifier import Program, Verifier, rank_auc, train_verifier, written_programs  # noqa: E402
from codeq.verifier.data import hold_out_tasks  # noqa: E402
from codeq.verifier.metrics import evaluation_programs  # noqa: E402

QWEN_GGUF = Path.home() / ".cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("/work/curve-defaults/store"))
    parser.add_argument("--train-run", default="curve", help="run whose collect wrote programs")
    parser.add_argument("--eval-run", default="curve-lr0.0001", help="run whose evaluate did")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument("--model", default=str(QWEN_GGUF))
    parser.add_argument("--max-train-programs", type=int, default=None)
    parser.add_argument("--max-validation-programs", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval-fraction", type=float, default=0.2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, default=Path("/tmp/verifier-auc"))
    parser.add_argument("--checkpoint-every-s", type=float, default=600.0)
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def sample(items: list[Any], size: int | None, seed: int) -> list[Any]:
    """A seeded sample of `size` items (all of them, in order, without a size)."""
    if size is None or size >= len(items):
        return list(items)
    chosen = sorted(random.Random(seed).sample(range(len(items)), size))
    return [items[i] for i in chosen]


def tasks_of(store: Path, run: str, number: int, split: str) -> dict[str, Task]:
    path = store / "runs" / run / f"round-{number}" / "tasks" / f"{split}.jsonl"
    return {task.task_id: task for task in read_jsonl(path, Task)}


def validation_trajectories(store: Path, run: str, number: int) -> list[Trajectory]:
    """Every tree the evaluate stage searched on validation tasks (each role, each mode)."""
    eval_dir = store / "runs" / run / f"round-{number}" / "eval"
    files = sorted(eval_dir.glob("*/validation/trajectories-*.jsonl"))
    files = [path for path in files if ".partial." not in path.name]
    return [t for path in files for t in read_jsonl(path, Trajectory)]


def critique_auc(programs: list[Program], trajectories: list[Trajectory]) -> dict[str, Any]:
    """The self-critique's AUC over `programs` (the mean Q_ai of each program's critiques)."""
    wanted = {(p.task.task_id, p.program.strip()): bool(p.passed) for p in programs}
    scores: dict[tuple[str, str], list[float]] = {}
    for trajectory in trajectories:
        for node in trajectory.nodes[1:]:
            key = (trajectory.task_id, node.program.strip())
            if node.q_ai is not None and key in wanted:
                scores.setdefault(key, []).append(node.q_ai)
    keys = sorted(scores)
    auc = rank_auc([sum(scores[k]) / len(scores[k]) for k in keys], [wanted[k] for k in keys])
    return {"auc": auc, "programs": len(keys)}


# arguments that change nothing the run computes: a checkpoint made under others is resumed
NOT_FINGERPRINTED = {"threads", "work", "json", "checkpoint_every_s"}


def checkpoint_target(args: argparse.Namespace) -> Any:
    """Where training keeps its checkpoints (a folder store under --work), fingerprinted by
    the arguments that change what is computed."""
    from codeq.config import StoreConfig
    from codeq.train.checkpoints import CheckpointTarget

    fingerprint = {k: str(v) for k, v in vars(args).items() if k not in NOT_FINGERPRINTED}
    store = StoreConfig(uri=f"file://{(args.work / 'progress').resolve()}")
    return CheckpointTarget(store, "verifier-progress", fingerprint)


def resume_point(target: Any, args: argparse.Namespace) -> Path | None:
    """The last checkpoint an earlier run of this command kept, downloaded (None: none)."""
    from codeq.train.checkpoints import download_latest, latest

    store = target.open()
    record = latest(store, target.prefix)
    if record is None:
        return None
    if record["fingerprint"] != target.fingerprint:
        changed = sorted(
            key
            for key in set(record["fingerprint"]) | set(target.fingerprint)
            if record["fingerprint"].get(key) != target.fingerprint.get(key)
        )
        raise SystemExit(
            f"error: {args.work / 'progress'} holds a checkpoint made with other arguments "
            f"({', '.join(changed)}); use another --work, or delete it to start again"
        )
    into = args.work / "resume"
    shutil.rmtree(into, ignore_errors=True)
    print(f"resuming from step {record['step']} kept in {args.work / 'progress'}", flush=True)
    return download_latest(store, target.prefix, into)


def main(argv: list[str] | None = None) -> int:
    import torch

    from codeq.sandbox import Sandbox
    from codeq.tasks import score_programs
    from codeq.train.lineage import base_lineage

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = CodeQConfig(
        policy={"model": args.model, "device": "cpu", "dtype": args.dtype},
        sandbox={"workers": 1},
        verifier={
            "enabled": True,
            "max_length": args.max_length,
            "epochs": args.epochs,
            "learning_rate": args.learning_rate,
            "lora_r": args.lora_r,
            "lora_alpha": 2 * args.lora_r,
            "batch_size": args.batch_size,
            "eval_fraction": args.eval_fraction,
            "seed": args.seed,
            "checkpoint_every_s": args.checkpoint_every_s,
        },
    )
    started = time.perf_counter()
    round_dir = args.store / "runs" / args.train_run / f"round-{args.round}"
    trajectories = read_trajectories([round_dir / "trajectories"])
    train_tasks = tasks_of(args.store, args.train_run, args.round, "train")
    written = written_programs(trajectories, train_tasks, config.verifier.max_programs_per_task)
    programs = sample(written, args.max_train_programs, args.seed)
    base = base_lineage(config.policy)
    target = checkpoint_target(args)
    trained = train_verifier(
        programs,
        args.work,
        config,
        base=base,
        round_number=args.round,
        checkpoints=target,
        resume_from=resume_point(target, args),
    )
    shutil.rmtree(args.work / "progress", ignore_errors=True)  # trained: its checkpoints are spent
    train_seconds = time.perf_counter() - started

    _, held_out = hold_out_tasks(programs, args.eval_fraction, args.seed)
    validation_tasks = list(tasks_of(args.store, args.eval_run, args.round, "validation").values())
    items, _ = evaluation_programs(
        validation_tasks, validation_trajectories(args.store, args.eval_run, args.round)
    )
    items = sample(items, args.max_validation_programs, args.seed)
    with Sandbox(config.sandbox) as sandbox:
        labels = [verdict.passed for verdict in score_programs(items, "all", sandbox)]
    verifier = Verifier.load(args.work / "verifier", config, base)
    scored = time.perf_counter()
    scores = verifier.score(items)
    result = {
        "command": "python bench/verifier_auc.py "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "args": {key: str(value) for key, value in vars(args).items()},
        "base": base.model_dump(),
        "train_programs": {
            "written": len(written),
            "used": len(programs),
            "passing": sum(bool(p.passed) for p in programs),
            "held_out": len(held_out),
        },
        "heldout_auc": trained["heldout_auc"],
        "critique_heldout": critique_auc(held_out, trajectories),
        "critique_all_train": critique_auc(programs, trajectories),
        "validation": {
            "programs": len(items),
            "passing": sum(labels),
            "auc": rank_auc(scores, labels),
            "scores": [
                {"task_id": task.task_id, "passed": label, "score": round(score, 4)}
                for (task, _), label, score in zip(items, labels, scores, strict=True)
            ],
        },
        "train_loss": trained["train_loss"],
        "global_steps": trained["global_steps"],
        "resumed_from_step": trained["resumed_from_step"],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "seconds": {
            "train": round(train_seconds, 1),
            "score_validation": round(time.perf_counter() - scored, 1),
            "total": round(time.perf_counter() - started, 1),
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"verifier AUC: held-out train problems {trained['heldout_auc']}, validation "
        f"{result['validation']['auc']} over {len(items)} programs ({sum(labels)} passing); "
        f"self-critique on held-out train problems {result['critique_heldout']['auc']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
