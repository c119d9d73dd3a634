"""MCTS, best-of-N and multi-turn best-of-N at equal programs, on validation tasks (never test).

One `codeq evaluate` of one policy (the base model, or --adapter) with modes [bon, mt_bon, mcts]
on a validation file, with the learning curve's settings (`--search-settings defaults`: the same
prompt, widening, refinement, depth and generation as the curve's rounds and its test
measurement). The three searches are sized to write at most the same number of programs a
task: MCTS's --rollouts R of --rewrites K, multi-turn best-of-N's --turns T of --samples N (so
N x T = K x R), and best-of-(K x R). Every search chooses its answer the same way (visible
tests, then the self-critique), and every answer is scored on all of the task's tests (visible
+ hidden). Rows pair, on the same tasks: MCTS at each rollout budget b with best-of-(K x b);
multi-turn best-of-N at each turn budget t with best-of-(N x t); and the two tree-like
searches with each other at the full budget. Each row has the tasks gained and lost and the
exact one-sided McNemar p; --json keeps them with every per-task outcome and the settings, and
how each search's choice of answer did against an oracle's (tasks some rewrite solves that the
returned answer fails).

    OMP_WAIT_POLICY=ACTIVE python bench/search_modes.py \
        --tasks /work/curve-defaults/store/runs/curve/round-0/tasks/validation.jsonl \
        --model ~/.cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --out /work/search-modes --json docs/results/search-modes/base-validation.json

The evaluation resumes (tree by tree, each mode saved when it finishes): run the same command
again after an interruption. On another machine: `--keep DIR` restores the searched trees
compressed into DIR (committed to git) before it goes on, and the run compresses them there
again whenever a search ends a group of search.parallel_trees trees (what a resume does not
search again); `--persist` does the same beside a run started without it. A --test-run also
keeps the verifier's scores there as it computes them, so a resumed run scores nothing twice:

    python bench/search_modes.py ... --keep docs/results/search-modes/base-trees --persist

A finished run's tables, as the README shows them, from its committed record (no model):

    python bench/search_modes.py --show docs/results/search-modes/round-16-test.json

`--test-run` is the one run on test tasks that docs/results.md specifies after the chain (the
run of the validation decisions): a test file only with it, the first --skip tasks left out (the
curve's 60 are spent), every answer chosen by execution agreement (evaluate.agreement_probes,
answered probes first) and then the verifier kept at --verifier DIR (checked against --model's
base). Each search's trees are then answered again by the self-critique, and by agreement then
the critique, so the critique's choice from the same trees stands beside the verifier's; the
evaluation's own answers are recomputed from the trees as a check. It never writes into an
existing --json: the test tasks are run once.

A policy the curve promoted after more than one adapter (round 15's: base + round 3 + round 15)
is named by its round record and the store holding its adapters, and evaluated as the curve
evaluates it (every adapter merged into the base, each checked by its sha256):

    python bench/search_modes.py ... --policy docs/results/learning-curve-defaults/round-16.json \
        --store /work/curve-defaults/store
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from codeq.config import CodeQConfig, load_config  # noqa: E402

MODES = ["bon", "mt_bon", "mcts"]  # bon first: it is the baseline the others are judged by


def bench_config(args: argparse.Namespace) -> CodeQConfig:
    """The learning curve's settings (today's search defaults), with the three searches sized
    to the same number of programs and every task of the file evaluated."""
    import learning_curve

    curve_args = ["--search-settings", "defaults", "--model", args.model]
    if args.tiny:
        curve_args.append("--tiny")
    settings = learning_curve.curve_settings(learning_curve.parse_args(curve_args))
    if args.max_new_tokens:
        settings["policy"]["max_new_tokens"] = args.max_new_tokens
    settings["search"].update(
        {
            "rewrites_per_expansion": args.rewrites,
            "rollouts": args.rollouts,
            "bon_samples": args.rewrites * args.rollouts,
            "mt_bon_samples": args.samples,
            "mt_bon_turns": args.turns,
            "seed": args.seed,
        }
    )
    budgets = sorted({2**i for i in range(args.rollouts.bit_length())} | {args.rollouts})
    settings["evaluate"] = {"modes": MODES, "rollout_ablation": budgets, "max_tasks": None}
    settings.pop("store", None)
    return load_config(None, settings)


def paired_row(label: str, first: Any, second: Any, names: tuple[str, str]) -> dict[str, Any]:
    """`first` against `second` on the same tasks: gained and lost by `first`, exact p."""
    from codeq.promotion import compare_modes

    paired = compare_modes(label, first, second).model_dump()
    paired["first"], paired["second"] = names
    paired["first_programs"] = round(first.programs, 2)
    paired["second_programs"] = round(second.programs, 2)
    return paired


def rows(results: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every pairing at equal programs that the evaluation can read."""
    table = []
    for budget, mcts in sorted(results.mcts_rollout_ablation.items(), key=lambda i: int(i[0])):
        size = str(args.rewrites * int(budget))
        if size in results.bon_ablation:
            names = (f"mcts@{budget}", f"bon@{size}")
            table.append(paired_row(" vs ".join(names), mcts, results.bon_ablation[size], names))
    for turns, multi in sorted(results.mt_bon_ablation.items(), key=lambda i: int(i[0])):
        size = str(args.samples * int(turns))
        names = (f"mt_bon@{args.samples}x{turns}", f"bon@{size}")
        table.append(paired_row(" vs ".join(names), multi, results.bon_ablation[size], names))
    names = (f"mt_bon@{args.samples}x{args.turns}", f"mcts@{args.rollouts}")
    table.append(
        paired_row(" vs ".join(names), results.modes["mt_bon"], results.modes["mcts"], names)
    )
    return table


def verdict(table: list[dict[str, Any]], tasks: int, programs: int) -> str:
    """Which search answers best at the full budget, in the terms of issue 37's goal: a mode
    beats best-of-N by >= 5 points with p < 0.05, or sampling is the better search here."""
    full = [row for row in table if row["second"] == f"bon@{programs}"]
    winners = [
        row
        for row in full
        if row["p_better"] < 0.05
        and row["candidate_solved"] - row["incumbent_solved"] >= 0.05 * tasks
    ]
    if winners:
        best = max(winners, key=lambda row: row["candidate_solved"])
        return (
            f"{best['first']} beats best-of-{programs} by {best['candidate_solved'] - best['incumbent_solved']} "
            f"of {tasks} tasks (p = {best['p_better']:.3g})"
        )
    best = max(full, key=lambda row: row["candidate_solved"])
    if best["candidate_solved"] <= best["incumbent_solved"]:
        return (
            f"best-of-{programs} solves at least as many as every other search at {programs} "
            "programs: at this size sampling is the better search"
        )
    return (
        f"no search beats best-of-{programs} by 5 points with p < 0.05; the closest, "
        f"{best['first']}: {best['candidate_solved']} against {best['incumbent_solved']} "
        f"(+{len(best['gained'])} / -{len(best['lost'])}, p = {best['p_better']:.3g})"
    )


def p_text(row: dict[str, Any]) -> str:
    """The exact one-sided p the way docs/results.md writes it: for a gain (or a tie) that of a
    gain, for a net loss that of a loss."""
    from curve_figure import p_clause  # the results page's own wording ('p < 0.001' too)

    if len(row["gained"]) >= len(row["lost"]):
        return p_clause(row["p_better"])
    return p_clause(row["p_worse"], "p worse")


def outcome_lines(record: dict[str, Any]) -> list[str]:
    """A run's tables as docs/results/search-modes/README.md shows them, from its --json
    record alone (no model): every pairing, the verdict, each search's choice of answer
    against an oracle's and, for a --test-run, every selector's answers from the same trees."""
    lines = [
        "| figure | first | second | gained / lost (p) | programs a task |",
        "|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        lines.append(
            f"| {row['mode']} | {row['candidate_solved']} | {row['incumbent_solved']} | "
            f"+{len(row['gained'])} / -{len(row['lost'])} ({p_text(row)}) | "
            f"{row['first_programs']} vs {row['second_programs']} |"
        )
    lines += ["", record["verdict"], ""]
    lines += [
        "| search | tasks with a visible-passing rewrite | solvable | lost by the choice |",
        "|---|---|---|---|",
    ]
    for choice in record["selection"]:
        lines.append(
            f"| {choice['mode']} | {choice['visible_passing']} | {choice['solvable']} | "
            f"{len(choice['lost'])} ({choice['lost_per_60_tasks']} in 60 tasks) |"
        )
    for mode, found in record.get("forests", {}).items():
        chosen = ", ".join(
            f"{name} {figures['solved']}" for name, figures in found["selectors"].items()
        )
        lines.append(f"{mode} answered again from its trees: {chosen} of {found['trees']}")
    return lines


def selection_rows(results: Any) -> list[dict[str, Any]]:
    """Per search at its full budget: how its choice of answer did against an oracle's (issue
    37's goal: at most 1 task in 60 lost to hidden tests where some rewrite passes them all)."""
    tasks = len(results.task_ids)
    table = []
    for mode in MODES:
        selection = results.modes[mode].selection
        if selection is None:  # results written before choices were recorded
            continue
        table.append(
            {
                "mode": mode,
                "visible_passing": selection.visible_passing,
                "solvable": len(selection.solvable),
                "lost": selection.lost,
                "lost_per_60_tasks": round(60 * len(selection.lost) / tasks, 2),
            }
        )
    return table


def persist_trees(out: Path, keep: Path) -> None:
    """Every resume file of the evaluation in `out` (each mode's searched trees and their key)
    compressed into `keep`, replacing what it held: what another machine needs to go on."""
    import lzma

    from codeq.evaluate.run import is_resume_file

    keep.mkdir(parents=True, exist_ok=True)
    for old in keep.glob("*.xz"):
        if is_resume_file(old.name.removesuffix(".xz")):  # the verifier's kept scores stay
            old.unlink()
    for path in sorted(out.iterdir()):
        if is_resume_file(path.name):
            (keep / f"{path.name}.xz").write_bytes(lzma.compress(path.read_bytes(), preset=9))
    size = sum(path.stat().st_size for path in keep.glob("*.xz"))
    print(f"kept {len(list(keep.glob('*.xz')))} files, {size / 1e6:.1f} MB, in {keep}")


def persisting_at_group_edges(out: Path, keep: Path, group: int, tasks: int) -> Any:
    """An evaluation's on_tree hook that runs `persist_trees` whenever a search's trees reach
    a group edge (a multiple of search.parallel_trees, or every task): a deterministic search
    takes its tasks in those fixed groups and a resume searches an unfinished group whole
    again, so a copy kept inside a group saves no time and the edges are where to keep one."""

    def on_tree(tree: Any) -> None:
        partial = out / f"trajectories-{tree.label}.partial.jsonl"
        with partial.open("rb") as lines:
            done = sum(1 for _ in lines)
        if done % group == 0 or done == tasks:
            persist_trees(out, keep)
            print(f"{tree.label}: {done} of {tasks} trees kept in {keep}", file=sys.stderr)

    return on_tree


def restore_trees(keep: Path, out: Path) -> None:
    """The trees `persist_trees` kept, into an evaluation folder that does not hold them yet
    (a folder that does is further along: it is left as it is)."""
    import lzma

    from codeq.evaluate.run import is_resume_file

    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(keep.glob("*.xz")):
        target = out / path.name.removesuffix(".xz")
        if is_resume_file(target.name) and not target.exists():  # kept scores: read in place
            target.write_bytes(lzma.decompress(path.read_bytes()))
            print(f"restored {target.name} from {keep}", file=sys.stderr)


def kept_scores(verifier: Any, folder: Path) -> Any:
    """The verifier's scores kept in `folder` (--keep where given, so git holds them beside
    the trees; else --out) as they are computed, 64 at a time, and read back first: a resumed
    run does not score again the tied programs of the searches an earlier process finished
    (75 min of this CPU for best-of-16's test trees). The file is named by the verifier's id,
    so no other verifier's scores are ever read."""
    from verifier_auc import KeptScores

    folder.mkdir(parents=True, exist_ok=True)
    return KeptScores(verifier, folder / f"verifier-{verifier.id}-scores.jsonl.xz")


class LiveScores:
    """A loaded verifier as bench/answer_selection.py's scores: it scores every program."""

    def __init__(self, verifier: Any) -> None:
        self.verifier, self.id = verifier, verifier.id

    def score(self, items: list[tuple[Any, str]]) -> list[float]:
        return list(self.verifier.score(items))

    def covers(self, task: Any, programs: list[str]) -> bool:
        return True


def promoted_policy(record: Path, store: Path, config: CodeQConfig) -> tuple[Any, CodeQConfig]:
    """The policy a promoted round's record names (its candidate's lineage) and the config
    that loads it: every adapter read from `store` (a local store folder, where the curve keeps
    them), checked by its sha256 and merged into the configured base once, as the curve
    evaluates it. Refused: a record of a round validation kept out, a lineage on another base
    model than --model, an adapter the store lacks or holds with other weights."""
    import json

    from codeq.errors import BadInputError, ConfigError
    from codeq.schemas import Lineage
    from codeq.train.lineage import base_lineage, materialize

    try:
        found = json.loads(record.read_text())
        promoted, candidate = found["promoted"], Lineage.model_validate(found["candidate"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(
            f"{record} is no round record with a candidate ({type(exc).__name__})",
            hint="name a curve's round-N.json, e.g. docs/results/learning-curve-defaults/round-16.json",
        ) from None
    if not promoted:
        raise BadInputError(
            f"{record}: round {found.get('round')} was kept out by validation",
            hint="the test run measures promoted policies only",
        )
    base = base_lineage(config.policy)
    if candidate.base_sha256 != base.base_sha256:
        raise ConfigError(
            f"{record}'s policy builds on {candidate.base_model} "
            f"({candidate.base_sha256[:12]}), but --model is {base.base_model} "
            f"({base.base_sha256[:12]})",
            hint="give the --model that round's curve ran with",
        )
    folders = [store / link.source for link in candidate.adapters]
    model = materialize(candidate, folders, config.policy)
    policy = config.policy.model_copy(update={"model": model, "adapter": None})
    return candidate, config.model_copy(update={"policy": policy})


def test_run_refusal(args: argparse.Namespace, config: CodeQConfig | None = None) -> str | None:
    """Why this invocation may not run on its tasks file (None: it may). Test tasks are run
    only by --test-run, once, with the verifier and agreement docs/results.md specified."""
    on_test = not args.tasks.name.startswith("validation")
    if args.policy is not None and args.adapter is not None:
        return "--policy names every adapter of a promoted policy: leave out --adapter"
    if (args.policy is None) != (args.store is None):
        return "--policy and --store go together: the round's record and the store of its adapters"
    if not args.test_run:
        if on_test:
            return "compare search modes on a validation file, never on test tasks"
        if args.skip or args.verifier:
            return "--skip and --verifier belong to --test-run"
        return None
    if not on_test:
        return "--test-run is the run on test tasks: give a test.jsonl"
    if args.verifier is None or args.json is None:
        return "--test-run needs --verifier DIR (the kept verifier) and --json FILE"
    if args.json.exists():
        return f"{args.json} exists: the test tasks are run once, never into an earlier result"
    if config is not None and not config.evaluate.agreement_probes:
        return "--test-run chooses answers by execution agreement: evaluate.agreement_probes is 0"
    return None


def test_tasks(args: argparse.Namespace) -> Path:
    """The test file without its first --skip tasks, written beside the evaluation."""
    from codeq.schemas import Task, read_jsonl, write_jsonl

    tasks = read_jsonl(args.tasks, Task)
    if args.skip >= len(tasks):
        raise SystemExit(f"error: --skip {args.skip} leaves none of {args.tasks}'s {len(tasks)}")
    path = args.out / "tasks" / "test.jsonl"
    write_jsonl(path, tasks[args.skip :])
    return path


def answered_again(
    results: Any, out: Path, tasks_path: Path, verifier: Any, config: CodeQConfig
) -> dict[str, Any]:
    """Each search's trees answered again by every selector of bench/answer_selection.py (the
    self-critique among them); the evaluation's own answers (agreement, answered probes first,
    then the verifier) recomputed from the same trees must be the ones it scored."""
    import answer_selection

    from codeq.sandbox import Sandbox
    from codeq.schemas import Task, read_jsonl

    tasks = {task.task_id: task for task in read_jsonl(tasks_path, Task)}
    forests = answer_selection.forests(out)
    options = argparse.Namespace(
        probes=config.evaluate.agreement_probes, seed=config.search.seed, explain=False
    )
    measured = {}
    with Sandbox(config.sandbox) as sandbox:
        for mode in MODES:
            found = answer_selection.measure_forest(
                mode, forests[mode], tasks, LiveScores(verifier), sandbox, options
            )
            solved = {t for t, ok in results.modes[mode].per_task.items() if ok}
            again = set(found["per_task"]["answered+verifier"])
            if again != solved:
                raise SystemExit(
                    f"error: {mode}'s answers recomputed from its trees solve "
                    f"{sorted(again ^ solved)[:5]} differently from the evaluation"
                )
            # the verifier decision's one test run: its answers against the critique's
            found["comparisons"].append(
                answer_selection.compare(solved_by(found, tasks), "critique", "answered+verifier")
            )
            measured[mode] = found
    return measured


def answered(tasks: dict[str, Any], solved: list[str]) -> dict[str, bool]:
    return {task_id: task_id in solved for task_id in tasks}


def solved_by(found: dict[str, Any], tasks: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """selector -> task id -> solved, over every task of the forest."""
    return {name: answered(tasks, solved) for name, solved in found["per_task"].items()}


def test_run_record(
    args: argparse.Namespace, verifier: Any, selectors: dict[str, Any]
) -> dict[str, Any]:
    """What a --test-run adds to its JSON: the tasks left out, the verifier and each search's
    answers by every selector from the same trees."""
    if not args.test_run:
        return {}
    return {
        "skip": args.skip,
        "verifier": {"folder": str(args.verifier), **verifier.info.model_dump(mode="json")},
        "forests": selectors,  # as bench/answer_selection.py names them (the ledger reads both)
    }


def show(record_path: Path) -> None:
    """--show: the tables of a written record, for the README's outcome sections."""
    import json

    try:
        lines = outcome_lines(json.loads(record_path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"error: --show reads a --json record this bench wrote; {record_path}: {exc!r}"
        ) from exc
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, help="a validation.jsonl (required to run)")
    parser.add_argument("--model", help="policy.model (a .gguf file, a folder; required to run)")
    parser.add_argument("--adapter", type=Path, help="a LoRA adapter folder (default: base model)")
    parser.add_argument(
        "--policy",
        type=Path,
        help="a promoted round's record (the curve's round-N.json): its candidate, every adapter "
        "merged into --model as the curve evaluates it; with --store",
    )
    parser.add_argument(
        "--store", type=Path, help="with --policy: the local store folder holding its adapters"
    )
    parser.add_argument("--rewrites", type=int, default=2, help="K: MCTS rewrites an expansion")
    parser.add_argument("--rollouts", type=int, default=8, help="R: MCTS rollouts")
    parser.add_argument("--samples", type=int, default=4, help="N: multi-turn samples a turn")
    parser.add_argument("--turns", type=int, default=4, help="T: multi-turn turns at most")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="default: the curve's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="the tiny curve's generation sizes")
    parser.add_argument("--out", type=Path, default=Path("codeq-runs/search-modes"))
    parser.add_argument("--json", type=Path, help="also write the rows and settings here")
    parser.add_argument(
        "--keep", type=Path, help="compressed trees for git: restored into --out first"
    )
    parser.add_argument(
        "--test-run",
        action="store_true",
        help="the one run on test tasks after the chain (docs/results.md): a test file, "
        "answers chosen by agreement then --verifier, the critique's beside them; once",
    )
    parser.add_argument("--verifier", type=Path, help="with --test-run: the kept verifier")
    parser.add_argument(
        "--skip", type=int, default=0, help="with --test-run: leave out the first N test tasks"
    )
    parser.add_argument(
        "--persist",
        action="store_true",
        help="compress the trees --out holds so far into --keep and exit (beside a run)",
    )
    parser.add_argument(
        "--show",
        type=Path,
        help="print a finished run's tables from its --json record (no model) and exit",
    )
    args = parser.parse_args()
    if args.show is not None:
        show(args.show)
        return
    if args.tasks is None or args.model is None:
        parser.error("--tasks and --model are required to run (only --show reads a record)")
    if args.persist:
        if args.keep is None:
            raise SystemExit("error: --persist writes into --keep DIR; name one")
        persist_trees(args.out, args.keep)
        return
    refusal = test_run_refusal(args)
    if refusal:
        raise SystemExit(f"error: {refusal}")
    programs = args.rewrites * args.rollouts
    if args.samples * args.turns != programs:
        raise SystemExit(
            f"error: --samples x --turns ({args.samples} x {args.turns}) must equal --rewrites x "
            f"--rollouts ({args.rewrites} x {args.rollouts}): the searches are compared at equal "
            "programs"
        )

    from codeq.evaluate import evaluate

    config = bench_config(args)
    refusal = test_run_refusal(args, config)
    if refusal:
        raise SystemExit(f"error: {refusal}")
    if args.keep is not None and args.keep.is_dir():
        restore_trees(args.keep, args.out)
    started = time.perf_counter()
    engine, lineage = None, None
    if args.policy is not None:
        from codeq.errors import CodeQError
        from codeq.logs import report_error
        from codeq.policy import load_policy

        try:
            lineage, merged = promoted_policy(args.policy, args.store, config)
        except CodeQError as exc:  # one error: line and a hint, as the CLI prints them
            sys.exit(report_error(exc, traceback=False))
        engine = load_policy(merged.policy, seed=config.tasks.seed)
    tasks_path, verifier, scores, tie_break = args.tasks, None, None, None
    if args.test_run:
        from codeq.train.lineage import base_lineage
        from codeq.verifier import Verifier, VerifierTieBreak

        tasks_path = test_tasks(args)
        scratch = args.out / "kept-verifier"
        verifier = Verifier.load_kept(args.verifier, config, base_lineage(config.policy), scratch)
        scores = kept_scores(verifier, args.keep or args.out)
        tie_break = VerifierTieBreak(scores)  # named by the verifier's id, as verifier.tie_break()
    split = "test" if args.test_run else "validation"
    on_tree = None
    if args.keep is not None:
        from codeq.evaluate.run import load_eval_tasks

        searched = load_eval_tasks(tasks_path, split, config.evaluate.max_tasks)  # as evaluate
        on_tree = persisting_at_group_edges(
            args.out, args.keep, config.search.parallel_trees, len(searched)
        )
    results = evaluate(
        tasks_path,
        args.out,
        config,
        split=split,
        adapter=args.adapter,
        engine=engine,
        policy=lineage,
        tie_break=tie_break,
        on_tree=on_tree,
    )
    selectors = answered_again(results, args.out, tasks_path, scores, config) if verifier else {}
    table = rows(results, args)
    tasks = len(results.task_ids)
    decision = verdict(table, tasks, programs)
    choices = selection_rows(results)
    shown = {"rows": table, "verdict": decision, "selection": choices, "forests": selectors}
    print("\n".join(outcome_lines(shown)))
    if args.json is not None:
        from codeq.schemas import write_json

        # the evaluation's own results beside it: the ledger (bench/paired_tests.py) recomputes
        # every row task by task from this standard file
        results_file = args.json.with_name(f"{args.json.stem}-results.json")
        write_json(results_file, results.model_dump(mode="json"), indent=1)
        costs = ("completion_tokens", "prompt_tokens", "seconds", "solved", "programs")
        write_json(
            args.json,
            {
                "command": "python " + " ".join(sys.argv),
                "date": time.strftime("%Y-%m-%d"),
                "results": results_file.name,
                "split": results.split,
                "task_ids": results.task_ids,
                "model": config.policy.model,
                "adapter": str(args.adapter) if args.adapter else None,
                "lineage": lineage.model_dump(mode="json") if lineage else None,
                "programs_at_most": programs,
                "search": config.search.model_dump(mode="json"),
                "policy": config.policy.model_dump(mode="json"),
                "rows": table,
                "verdict": decision,
                "selection": choices,
                "searches": {
                    mode: {key: getattr(results.modes[mode], key) for key in costs}
                    for mode in MODES
                },
                "per_task": {
                    "mcts": {b: r.per_task for b, r in results.mcts_rollout_ablation.items()},
                    "mt_bon": {t: r.per_task for t, r in results.mt_bon_ablation.items()},
                    "bon": {n: r.per_task for n, r in results.bon_ablation.items()},
                },
                "wall_seconds": round(time.perf_counter() - started, 1),
                **test_run_record(args, verifier, selectors),
            },
            indent=1,
        )


if __name__ == "__main__":
    main()
