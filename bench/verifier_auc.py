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
--objective pairwise learns from (passing, failing) programs of one task (TRL reward training);
--also-train-on adds later rounds' collects (each round's train tasks are new problems).

Resumable: every --checkpoint-every-s seconds training keeps a checkpoint under
<work>/progress; the same command run again (after a kill, or on another machine with <work>
copied) continues from the last one. One made with other arguments is refused.

Across machines through git: --keep DIR receives the trained verifier (adapter, score head,
tokenizer, with each file's sha256 and the arguments that trained it) as soon as training
ends, and its scores as they are computed, 64 programs at a time; the same command on a fresh
machine restores both and goes on scoring where it stopped, training nothing again. A kept
verifier trained with other arguments, or a kept file that fails its sha256, is refused.
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
from codeq.verifier import (  # noqa: E402
    Program,
    Verifier,
    auc_interval,
    rank_auc,
    train_verifier,
    within_task_auc,
    within_task_interval,
    written_programs,
)
from codeq.verifier.data import hold_out_tasks, within_task_pairs  # noqa: E402
from codeq.verifier.metrics import evaluation_programs  # noqa: E402

QWEN_GGUF = Path.home() / ".cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("/work/curve-defaults/store"))
    parser.add_argument("--train-run", default="curve", help="run whose collect wrote programs")
    parser.add_argument("--eval-run", default="curve-lr0.0001", help="run whose evaluate did")
    parser.add_argument("--round", type=int, default=0)
    parser.add_argument(
        "--also-train-on",
        nargs="*",
        default=[],
        metavar="RUN:ROUND",
        help="more collects to learn from (their train tasks are other problems), e.g. "
        "curve-lr0.0001:1 curve-lr0.0001:2",
    )
    parser.add_argument("--model", default=str(QWEN_GGUF))
    parser.add_argument("--max-train-programs", type=int, default=None)
    parser.add_argument("--max-validation-programs", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval-fraction", type=float, default=0.2)
    parser.add_argument("--objective", choices=["pointwise", "pairwise"], default="pointwise")
    parser.add_argument("--pairs-per-task", type=int, default=16, help="pairwise only")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--work", type=Path, default=Path("/tmp/verifier-auc"))
    parser.add_argument("--checkpoint-every-s", type=float, default=600.0)
    parser.add_argument(
        "--search-trees",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="trees a search wrote on the --eval-run's validation tasks (trajectories-*.jsonl, "
        "e.g. bench/search_modes.py's best-of-16): every distinct rewrite is run on all its "
        "tests, and the verifier and the self-critique rank the rewrites of each task that has "
        "both a passing and a failing one (the choice pairs and tie-breaks make)",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="for git: the trained verifier and the scores computed so far are written here "
        "and restored from here (a fresh machine goes on without training again)",
    )
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def sample(items: list[Any], size: int | None, seed: int) -> list[Any]:
    """A seeded sample of `size` items (all of them, in order, without a size)."""
    if size is None or size >= len(items):
        return list(items)
    chosen = sorted(random.Random(seed).sample(range(len(items)), size))
    return [items[i] for i in chosen]


def run_and_round(text: str) -> tuple[str, int]:
    """RUN:ROUND, as --also-train-on names a collect."""
    run, _, number = text.rpartition(":")
    if not run or not number.isdigit():
        raise SystemExit(
            f"error: --also-train-on {text!r}: expected RUN:ROUND, e.g. curve-lr0.0001:1"
        )
    return run, int(number)


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
    means = [sum(scores[k]) / len(scores[k]) for k in keys]
    labels = [wanted[k] for k in keys]
    return {
        "auc": rank_auc(means, labels),
        "within_task": within_task_auc([k[0] for k in keys], means, labels),
        "programs": len(keys),
    }


def passes_visible(task: Task, verdict: Any) -> bool:
    """Whether a verdict on all the task's tests (visible first) passed the visible ones."""
    visible = verdict.tests[: len(task.visible_tests)]
    return len(visible) == len(task.visible_tests) and all(test.passed for test in visible)


def ranking(
    task_ids: list[str], scores: list[float], labels: list[bool], visible: list[bool]
) -> dict[str, Any]:
    """The AUC with a task-resampled 95% interval, the AUC within tasks, and the AUC within
    tasks among the programs that pass their visible tests (the answers a tie-break chooses
    among), with every program's score."""
    among = [i for i, passed in enumerate(visible) if passed]
    return {
        "programs": len(scores),
        "passing": sum(labels),
        "passing_visible": len(among),
        "auc": rank_auc(scores, labels),
        "auc_interval_95": auc_interval(task_ids, scores, labels),
        "within_task": within_task_auc(task_ids, scores, labels),
        "within_task_interval_95": within_task_interval(task_ids, scores, labels),
        "within_task_passing_visible": within_task_auc(
            [task_ids[i] for i in among], [scores[i] for i in among], [labels[i] for i in among]
        ),
        "scores": [
            {"task_id": task_id, "passed": label, "passed_visible": seen, "score": round(score, 4)}
            for task_id, label, seen, score in zip(task_ids, labels, visible, scores, strict=True)
        ],
    }


def answers_by_tie_break(
    trees: list[Trajectory],
    tasks: list[Task],
    verifier: Any,
    passed: dict[tuple[str, str], bool],
) -> dict[str, Any]:
    """Each tree's answer chosen again from its rewrites, once with the self-critique breaking
    ties at the top of the visible tests (the search's own choice) and once with the verifier,
    each scored on all the task's tests: what the tie-break changes in solved tasks."""
    from codeq.promotion import one_sided_mcnemar
    from codeq.search.tree import critique_tie_break, final_answer
    from codeq.verifier import VerifierTieBreak

    by_id = {task.task_id: task for task in tasks}
    by_verifier = VerifierTieBreak(verifier)
    solved: dict[str, dict[str, bool]] = {"critique": {}, "verifier": {}}
    for tree in trees:
        task = by_id.get(tree.task_id)
        if task is None:
            continue
        for name, tie_break in (("critique", critique_tie_break), ("verifier", by_verifier)):
            answer = final_answer(tree.nodes[1:], tree.nodes[0], task, tie_break)
            solved[name][task.task_id] = passed.get((task.task_id, answer.program), False)
    critique, verifier_solved = solved["critique"], solved["verifier"]
    gained = sorted(t for t in critique if verifier_solved[t] and not critique[t])
    lost = sorted(t for t in critique if critique[t] and not verifier_solved[t])
    return {
        "tasks": len(critique),
        "tie_broken": by_verifier.decided,
        "critique_solved": sum(critique.values()),
        "verifier_solved": sum(verifier_solved.values()),
        "gained": gained,
        "lost": lost,
        "p_better": one_sided_mcnemar(len(gained), len(lost)),
        "p_worse": one_sided_mcnemar(len(lost), len(gained)),
    }


def search_ranking(
    paths: list[Path], tasks: list[Task], verifier: Any, sandbox: Any
) -> dict[str, Any]:
    """The verifier and the self-critique within the tasks of a search's trees that hold both
    a passing and a failing rewrite (labels from all the task's tests): only those pairs say
    whether a score chooses well among one task's programs."""
    from codeq.tasks import score_programs

    forests = {path: read_jsonl(path, Trajectory) for path in paths}
    trees = [tree for forest in forests.values() for tree in forest]
    items, critiques = evaluation_programs(tasks, trees)
    verdicts = score_programs(items, "all", sandbox)
    passed = {
        (task.task_id, program): verdict.passed
        for (task, program), verdict in zip(items, verdicts, strict=True)
    }
    labels_of: dict[str, set[bool]] = {}
    for (task_id, _), label in passed.items():
        labels_of.setdefault(task_id, set()).add(label)
    mixed = [i for i, (task, _) in enumerate(items) if len(labels_of[task.task_id]) == 2]
    chosen = [items[i] for i in mixed]
    labels = [verdicts[i].passed for i in mixed]
    task_ids = [task.task_id for task, _ in chosen]
    scores = verifier.score(chosen)
    critiqued = [
        i for i, (task, program) in enumerate(chosen) if (task.task_id, program) in critiques
    ]
    critique_scores = [
        sum(critiques[key]) / len(critiques[key])
        for key in ((chosen[i][0].task_id, chosen[i][1]) for i in critiqued)
    ]
    critique_ids = [task_ids[i] for i in critiqued]
    critique_labels = [labels[i] for i in critiqued]
    return {
        "trees": [str(path) for path in paths],
        "answers": {
            path.name: answers_by_tie_break(forest, tasks, verifier, passed)
            for path, forest in forests.items()
        },
        "tasks_searched": len({tree.task_id for tree in trees}),
        "programs": len(items),
        "passing": sum(verdict.passed for verdict in verdicts),
        "tasks_with_both": len(set(task_ids)),
        "verifier": ranking(
            task_ids,
            scores,
            labels,
            [passes_visible(task, verdicts[i]) for i, (task, _) in zip(mixed, chosen, strict=True)],
        ),
        "critique": {
            "programs": len(critiqued),
            "within_task": within_task_auc(critique_ids, critique_scores, critique_labels),
            "within_task_interval_95": within_task_interval(
                critique_ids, critique_scores, critique_labels
            ),
        },
    }


def decision(search: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rule declared before the pairwise run (docs/results/verifier/README.md): the
    verifier replaces the self-critique (`evaluate.tie_break`, `pairs.q_ai`) only if its
    within-task AUC on a search's validation rewrites is above 0.5 with a 95% interval that
    excludes 0.5, and its re-chosen answers solve at least as many tasks as the critique's in
    every search measured. None without a search to decide on."""
    if search is None:
        return None
    within = search["verifier"]["within_task"]["auc"]
    interval = search["verifier"]["within_task_interval_95"]
    failed = []
    if within is None or interval is None:
        failed.append("no task holds both a passing and a failing rewrite")
    elif not (within > 0.5 and interval[0] > 0.5):
        failed.append(
            f"within-task AUC {within:.3f} (95% {interval[0]:.3f}-{interval[1]:.3f}) "
            "does not exclude 0.5 from above"
        )
    for name, answers in search["answers"].items():
        if answers["verifier_solved"] < answers["critique_solved"]:
            failed.append(
                f"{name}: the verifier's answers solve {answers['verifier_solved']}, "
                f"the critique's {answers['critique_solved']}"
            )
    replaces = not failed
    return {
        "replaces_critique": replaces,
        "settings": {
            "evaluate.tie_break": "verifier" if replaces else "critique",
            "pairs.q_ai": "verifier" if replaces else "critique",
        },
        "why": failed or ["within-task AUC above 0.5 with its interval, answers no worse"],
    }


def collect_verdicts(trajectories: list[Trajectory]) -> dict[tuple[str, str], Any]:
    """Each written program's verdict on all its task's tests, by (task id, program)."""
    return {
        (trajectory.task_id, node.program.strip()): node.verdict
        for trajectory in trajectories
        if trajectory.reward_tests == "all"
        for node in trajectory.nodes[1:]
        if node.verdict is not None
    }


# arguments that change nothing the run computes: a checkpoint made under others is resumed
NOT_FINGERPRINTED = {"threads", "work", "json", "checkpoint_every_s", "search_trees", "keep"}
TRAINED_BY = "BENCH_ARGS.json"  # in <work>/verifier: the arguments that trained it
KEPT_FILE = "KEPT.json"  # in --keep: each kept file's sha256, and the arguments that trained it
KEPT_SCORES = "scores.jsonl.xz"  # in --keep: the verifier's scores computed so far
SCORES_AT_ONCE = 64  # programs scored between two saves of the kept scores


def fingerprint_of(args: argparse.Namespace) -> dict[str, str]:
    return {k: str(v) for k, v in vars(args).items() if k not in NOT_FINGERPRINTED}


def trained_here(args: argparse.Namespace) -> bool:
    """Whether --work holds a verifier these arguments trained."""
    record = args.work / "verifier" / TRAINED_BY
    return record.is_file() and json.loads(record.read_text()) == fingerprint_of(args)


def trained_earlier(args: argparse.Namespace) -> dict[str, Any] | None:
    """The training summary of a verifier this command already trained in --work (the same
    arguments), so that scoring again does not train again; None when there is none."""
    metrics = args.work / "metrics.json"
    if not trained_here(args) or not metrics.is_file():
        return None
    print(f"reusing the verifier this command trained in {args.work / 'verifier'}", flush=True)
    return json.loads(metrics.read_text())


def changed_arguments(recorded: dict[str, str], now: dict[str, str]) -> str:
    return ", ".join(
        sorted(key for key in set(recorded) | set(now) if recorded.get(key) != now.get(key))
    )


def keep_trained(args: argparse.Namespace) -> None:
    """The verifier trained in --work (its folder and metrics.json) into --keep for git, xz
    where it pays, each file listed in KEPT.json with its sha256 and size."""
    import hashlib

    import curve_rounds

    sources = sorted(p for p in (args.work / "verifier").rglob("*") if p.is_file())
    listed = {}
    for path in [*sources, args.work / "metrics.json"]:
        name = path.relative_to(args.work).as_posix()
        data = path.read_bytes()
        packed = curve_rounds.pack(data)
        file = name + (".xz" if packed is not data else "")
        (args.keep / file).parent.mkdir(parents=True, exist_ok=True)
        (args.keep / file).write_bytes(packed)
        listed[name] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "file": file,
        }
    record = {"fingerprint": fingerprint_of(args), "files": listed}
    (args.keep / KEPT_FILE).write_text(json.dumps(record, indent=1) + "\n")
    refuse_ignored_keep([args.keep / entry["file"] for entry in listed.values()])
    size = sum((args.keep / entry["file"]).stat().st_size for entry in listed.values())
    print(f"kept the trained verifier in {args.keep} ({size / 1e6:.1f} MB)", flush=True)


KEPT_EXAMPLES = (KEPT_FILE, KEPT_SCORES, "metrics.json.xz", "verifier/adapter_model.safetensors")


def refuse_ignored_keep(paths: list[Path]) -> None:
    """--keep is for git: a file there that .gitignore leaves out is refused with one line."""
    import curve_rounds

    ignored = curve_rounds.ignored_by_git(paths)
    if ignored:
        raise SystemExit(
            f"error: git ignores {ignored[0]}, so the kept verifier would not reach a commit; "
            "add an exception for it to .gitignore (as for docs/results/verifier/*/verifier/), "
            "or use another --keep"
        )


def restore_kept(args: argparse.Namespace) -> None:
    """The verifier --keep holds into --work, unless --work holds it already; refused (one
    error: line naming the file) when it was trained with other arguments or a file fails its
    sha256, never trained again over it."""
    import curve_rounds

    from codeq.errors import CorruptInputError

    record_path = args.keep / KEPT_FILE
    if not record_path.is_file():
        return
    record = json.loads(record_path.read_text())
    if record["fingerprint"] != fingerprint_of(args):
        raise SystemExit(
            f"error: {record_path} was trained with other arguments "
            f"({changed_arguments(record['fingerprint'], fingerprint_of(args))}); use another "
            "--keep, or the arguments it records"
        )
    if trained_here(args):
        return
    try:
        contents = {
            name: curve_rounds.committed_content(args.keep, name, entry, record=record_path)
            for name, entry in record["files"].items()
        }
    except CorruptInputError as exc:
        raise SystemExit(f"error: {exc}; {exc.hint}") from exc
    for name, data in contents.items():
        (args.work / name).parent.mkdir(parents=True, exist_ok=True)
        (args.work / name).write_bytes(data)
    print(f"restored the verifier kept in {args.keep} into {args.work}", flush=True)


def kept_score_key(task: Task, program: str) -> str:
    """The key a kept score is stored under: the sha256 of task id, NUL and program."""
    import hashlib

    return hashlib.sha256(f"{task.task_id}\0{program}".encode()).hexdigest()


def read_kept_scores(path: Path) -> dict[str, float]:
    """key -> score, from a kept-scores file (xz JSON Lines of {"key", "score"})."""
    import lzma

    lines = lzma.decompress(path.read_bytes()).decode().splitlines()
    return {row["key"]: row["score"] for row in map(json.loads, lines)}


class KeptScores:
    """A verifier's `score` (and `id`: it stands in for the verifier wherever one is used),
    each (task, program) scored once, the scores written to `path` (xz JSON Lines, keyed by
    the sha256 of task id and program) every SCORES_AT_ONCE programs, so that scoring stopped
    on one machine goes on from them on another."""

    def __init__(self, verifier: Any, path: Path | None) -> None:

        self.verifier, self.path = verifier, path
        self.scores: dict[str, float] = {}
        if path is not None and path.is_file():
            self.scores = read_kept_scores(path)
            print(f"{len(self.scores)} scores restored from {path}", flush=True)

    @property
    def id(self) -> str:
        return self.verifier.id

    def score(self, items: list[tuple[Task, str]]) -> list[float]:
        keys = [kept_score_key(task, program) for task, program in items]
        missing = list(
            {k: item for k, item in zip(keys, items, strict=True) if k not in self.scores}.items()
        )
        for start in range(0, len(missing), SCORES_AT_ONCE):
            chunk = missing[start : start + SCORES_AT_ONCE]
            scores = self.verifier.score([item for _, item in chunk])
            self.scores.update(zip((k for k, _ in chunk), scores, strict=True))
            self.save()
        return [self.scores[k] for k in keys]

    def save(self) -> None:
        import lzma

        if self.path is None:
            return
        lines = "".join(
            json.dumps({"key": k, "score": v}) + "\n" for k, v in sorted(self.scores.items())
        )
        written = self.path.with_name(self.path.name + ".tmp")
        written.write_bytes(lzma.compress(lines.encode(), preset=9))
        written.replace(self.path)


def checkpoint_target(args: argparse.Namespace) -> Any:
    """Where training keeps its checkpoints (a folder store under --work), fingerprinted by
    the arguments that change what is computed."""
    from codeq.config import StoreConfig
    from codeq.train.checkpoints import CheckpointTarget

    fingerprint = fingerprint_of(args)
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
        changed = changed_arguments(record["fingerprint"], target.fingerprint)
        raise SystemExit(
            f"error: {args.work / 'progress'} holds a checkpoint made with other arguments "
            f"({changed}); use another --work, or delete it to start again"
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
            "objective": args.objective,
            "pairs_per_task": args.pairs_per_task,
            "seed": args.seed,
            "checkpoint_every_s": args.checkpoint_every_s,
        },
    )
    started = time.perf_counter()
    collects = [(args.train_run, args.round), *map(run_and_round, args.also_train_on)]
    trajectories = read_trajectories(
        [args.store / "runs" / run / f"round-{number}" / "trajectories" for run, number in collects]
    )
    train_tasks = {
        task_id: task
        for run, number in collects
        for task_id, task in tasks_of(args.store, run, number, "train").items()
    }
    written = written_programs(trajectories, train_tasks, config.verifier.max_programs_per_task)
    programs = sample(written, args.max_train_programs, args.seed)
    base = base_lineage(config.policy)
    if args.keep is not None:
        refuse_ignored_keep([args.keep / name for name in KEPT_EXAMPLES])
        restore_kept(args)
    trained = trained_earlier(args)
    reused = trained is not None
    if reused and args.keep is not None and not (args.keep / KEPT_FILE).is_file():
        keep_trained(args)  # trained before --keep was asked, or kept where git refused it
    if trained is None:
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
        shutil.rmtree(args.work / "progress", ignore_errors=True)  # trained: checkpoints spent
        (args.work / "verifier" / TRAINED_BY).write_text(json.dumps(fingerprint_of(args)))
        if args.keep is not None:
            keep_trained(args)
    train_seconds = time.perf_counter() - started

    _, held_out = hold_out_tasks(programs, args.eval_fraction, args.seed)
    validation_tasks = list(tasks_of(args.store, args.eval_run, args.round, "validation").values())
    items, _ = evaluation_programs(
        validation_tasks, validation_trajectories(args.store, args.eval_run, args.round)
    )
    items = sample(items, args.max_validation_programs, args.seed)
    with Sandbox(config.sandbox) as sandbox:
        verdicts = score_programs(items, "all", sandbox)
    labels = [verdict.passed for verdict in verdicts]
    verifier = KeptScores(
        Verifier.load(args.work / "verifier", config, base),
        args.keep / KEPT_SCORES if args.keep is not None else None,
    )
    scored = time.perf_counter()
    scores = verifier.score(items)
    search = None
    if args.search_trees:
        with Sandbox(config.sandbox) as sandbox:
            search = search_ranking(args.search_trees, validation_tasks, verifier, sandbox)
    written_verdicts = collect_verdicts(trajectories)
    held_out_verdicts = [written_verdicts[(p.task.task_id, p.program.strip())] for p in held_out]
    held_out_scores = verifier.score([(p.task, p.program) for p in held_out])
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/verifier_auc.py "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "args": {key: str(value) for key, value in vars(args).items()},
        "base": base.model_dump(),
        "train_programs": {
            "written": len(written),
            "used": len(programs),
            "passing": sum(bool(p.passed) for p in programs),
            "held_out": len(held_out),
            "within_task_pairs": len(within_task_pairs(programs, args.pairs_per_task, args.seed)),
        },
        "heldout_auc": trained["heldout_auc"],
        "heldout": ranking(
            [p.task.task_id for p in held_out],
            held_out_scores,
            [bool(p.passed) for p in held_out],
            [passes_visible(p.task, v) for p, v in zip(held_out, held_out_verdicts, strict=True)],
        ),
        "critique_heldout": critique_auc(held_out, trajectories),
        "critique_all_train": critique_auc(programs, trajectories),
        "validation": ranking(
            [task.task_id for task, _ in items],
            scores,
            labels,
            [passes_visible(task, v) for (task, _), v in zip(items, verdicts, strict=True)],
        ),
        "search_validation": search,
        "decision": decision(search),
        "train_loss": trained["train_loss"],
        "reused_trained_verifier": reused,
        "global_steps": trained["global_steps"],
        "resumed_from_step": trained["resumed_from_step"],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "seconds": {
            "train": round(trained["train_seconds"] if reused else train_seconds, 1),
            "score": round(time.perf_counter() - scored, 1),
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
    if result["decision"] is not None:
        settings = result["decision"]["settings"]
        print(
            "decision (declared rule): "
            + ", ".join(f"{key} = {value}" for key, value in settings.items())
            + "; "
            + "; ".join(result["decision"]["why"])
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
