"""How a search's final answer is chosen among rewrites tied on the visible tests, measured on
committed validation trees: the self-critique (the search's own choice), the learned verifier
(its committed scores), and execution agreement before each (`codeq.search.agreement`: the tied
programs run on probe inputs made like hidden-test inputs from another seed, the behaviour most
tied rewrites share first). Every chosen answer is scored on all its task's tests. Nothing is
searched and no model is loaded; reads a store's tasks, never writes it.

    python bench/answer_selection.py --store /work/curve-defaults/store \
        --trees docs/results/search-modes/base-trees \
        --scores docs/results/verifier/pairwise-rounds-0-6/scores.jsonl.xz \
        --json docs/results/answer-selection/qwen-0.5b-validation.json

--trees is a folder of `trajectories-<mode>.partial.jsonl.xz` (or .jsonl) files, one forest
per mode; the verifier's selectors run on a forest only where every tied program has a score.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shlex
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from verifier_auc import kept_score_key, read_kept_scores  # noqa: E402

from codeq.schemas import Node, Task, Trajectory, tied_at_top  # noqa: E402
from codeq.search.tree import TieBreak, critique_tie_break, final_answer  # noqa: E402

# Declared before the first run (docs/results/answer-selection/README.md): agreement becomes
# the evaluation's default tie-break, before the verifier, if on best-of-16's validation trees
# "agreement, then verifier" solves more tasks than the verifier alone (gained > lost).
RULE = (
    "agreement before the verifier becomes evaluate's default if, on best-of-16's validation "
    "trees, it solves more tasks than the verifier alone (gained > lost)"
)
# Declared before the second run (2026-12-04, the README's second section).
ANSWERED_RULE = (
    "agreement ranks behaviours by answered probes before group size if, on best-of-16's "
    "validation trees, agreement then verifier with it solves more tasks than without "
    "(gained > lost) and it loses no task against agreement then critique on the other trees"
)
# Declared before the third run (2026-12-04, the README's third section): it reads this run's
# answers against the second run's (--baseline), each selector at its own probe count.
PROBES_RULE = (
    "evaluate.agreement_probes defaults to the run's probe count if, on best-of-16's "
    "validation trees, answered then verifier at that count solves more tasks than at the "
    "baseline's (gained > lost) and answered then critique loses no task against the "
    "baseline's on the other trees"
)
RULED_SELECTORS = {"bon": ["answered+verifier", "answered+critique"]}  # what PROBES_RULE reads
# Declared before the fourth run (2026-12-06, the README's fourth section), from the collect
# trees of train tasks only (codeq/search/nearest.py says what they showed).
NEAREST_RULE = (
    "agreement's equal groups are ordered by the smallest change to the buggy program before "
    "the scorer if, on best-of-16's validation trees, answered then nearest then verifier "
    "solves more tasks than answered then verifier (gained > lost) and answered then nearest "
    "then critique loses no task against answered then critique on the other trees"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="a local store folder")
    parser.add_argument("--run", default="curve-lr0.0001", help="the run whose tasks to read")
    parser.add_argument("--round", type=int, default=0, help="the round whose tasks to read")
    parser.add_argument("--trees", type=Path, required=True, help="folder of committed trees")
    parser.add_argument("--scores", type=Path, help="a verifier's kept scores (xz JSON Lines)")
    parser.add_argument("--probes", type=int, default=8, help="probe inputs per task")
    parser.add_argument("--seed", type=int, default=0, help="probe inputs' seed")
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers")
    parser.add_argument("--json", type=Path, required=True, help="where the result goes")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="an earlier run's record at another --probes: this run's answers are paired per "
        "task against it (the third declared rule) instead of against each other",
    )
    parser.add_argument(
        "--explain", action="store_true", help="list the tied programs of each task lost"
    )
    return parser.parse_args(argv)


def read_forest(path: Path) -> list[Trajectory]:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return [Trajectory.model_validate_json(line) for line in raw.decode().splitlines() if line]


def forests(folder: Path) -> dict[str, list[Trajectory]]:
    """mode -> its trees, from trajectories-<mode>[.partial].jsonl[.xz]."""
    found = {}
    for path in sorted(folder.glob("trajectories-*.jsonl*")):
        mode = path.name.removeprefix("trajectories-").split(".")[0]
        found[mode] = read_forest(path)
    return found


class CommittedScores:
    """A verifier's committed scores as a verifier: `score` looks each (task, program) up by
    the key bench/verifier_auc.py keeps it under; one it lacks raises KeyError."""

    def __init__(self, path: Path) -> None:
        self.scores = read_kept_scores(path)
        self.id = f"kept-{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"

    def score(self, items: list[tuple[Task, str]]) -> list[float]:
        return [self.scores[kept_score_key(task, program)] for task, program in items]

    def covers(self, task: Task, programs: list[str]) -> bool:
        return all(kept_score_key(task, program) in self.scores for program in programs)


def tied_nodes(tree: Trajectory) -> list[Node]:
    """The valid tested rewrites at the top of the visible tests."""
    return tied_at_top([node for node in tree.nodes[1:] if node.valid and node.verdict is not None])


def tied_programs(tree: Trajectory) -> list[str]:
    """The distinct programs of `tied_nodes`."""
    return sorted({node.program for node in tied_nodes(tree)})


def answers(trees: list[Trajectory], tasks: dict[str, Task], tie_break: TieBreak) -> dict:
    """task id -> the program the tree returns when `tie_break` breaks ties."""
    chosen = {}
    for tree in trees:
        task = tasks[tree.task_id]
        chosen[tree.task_id] = final_answer(tree.nodes[1:], tree.nodes[0], task, tie_break).program
    return chosen


def compare(solved: dict[str, dict[str, bool]], baseline: str, other: str) -> dict[str, Any]:
    from codeq.promotion import one_sided_mcnemar

    gained = sorted(t for t in solved[baseline] if solved[other][t] and not solved[baseline][t])
    lost = sorted(t for t in solved[baseline] if solved[baseline][t] and not solved[other][t])
    return {
        "baseline": baseline,
        "other": other,
        "gained": len(gained),
        "lost": len(lost),
        "p_better": one_sided_mcnemar(len(gained), len(lost)),
        "p_worse": one_sided_mcnemar(len(lost), len(gained)),
        "gained_tasks": gained,
        "lost_tasks": lost,
    }


def measure_forest(
    mode: str,
    trees: list[Trajectory],
    tasks: dict[str, Task],
    verifier: CommittedScores | None,
    sandbox: Any,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every selector's answers on one forest, each scored on all its task's tests, with the
    tasks some tied program solves (solvable) and each selector's losses among them."""
    from codeq.search.agreement import AgreementTieBreak
    from codeq.search.nearest import NearestTieBreak
    from codeq.tasks import score_programs
    from codeq.verifier import VerifierTieBreak

    trees = [tree for tree in trees if tree.task_id in tasks]
    tied = {tree.task_id: tied_programs(tree) for tree in trees}
    items = [(tasks[t], program) for t, programs in tied.items() for program in programs]
    verdicts = score_programs(items, "all", sandbox)
    passed = {
        (task.task_id, program): verdict.passed
        for (task, program), verdict in zip(items, verdicts, strict=True)
    }
    solvable = sorted(t for t, programs in tied.items() if any(passed[(t, p)] for p in programs))
    selectors: dict[str, TieBreak] = {"critique": critique_tie_break}
    agreement_critique = AgreementTieBreak(
        sandbox, args.probes, args.seed, critique_tie_break, answered_first=False
    )
    selectors["agreement+critique"] = agreement_critique
    selectors["answered+critique"] = AgreementTieBreak(
        sandbox, args.probes, args.seed, critique_tie_break, answered_first=True
    )
    selectors["answered+nearest+critique"] = AgreementTieBreak(
        sandbox, args.probes, args.seed, NearestTieBreak(critique_tie_break), answered_first=True
    )
    scored = verifier is not None and all(  # a single tied program is never scored
        verifier.covers(tasks[t], programs) for t, programs in tied.items() if len(programs) > 1
    )
    if scored:
        assert verifier is not None
        selectors["verifier"] = VerifierTieBreak(verifier)  # type: ignore[arg-type]
        selectors["agreement+verifier"] = AgreementTieBreak(
            sandbox, args.probes, args.seed, selectors["verifier"], answered_first=False
        )
        selectors["answered+verifier"] = AgreementTieBreak(
            sandbox, args.probes, args.seed, selectors["verifier"], answered_first=True
        )
        selectors["answered+nearest+verifier"] = AgreementTieBreak(
            sandbox,
            args.probes,
            args.seed,
            NearestTieBreak(selectors["verifier"]),
            answered_first=True,
        )
    solved: dict[str, dict[str, bool]] = {}
    for name, tie_break in selectors.items():
        chosen = answers(trees, tasks, tie_break)
        solved[name] = {t: passed.get((t, program), False) for t, program in chosen.items()}
    result: dict[str, Any] = {
        "trees": len(trees),
        "tied_tasks": sum(len(programs) >= 2 for programs in tied.values()),
        "probed_tasks": agreement_critique.probed,
        "tasks_without_probes": len(agreement_critique.no_probes),
        "solvable": len(solvable),
        "verifier_scores": scored,
        "selectors": {
            name: {
                "solved": sum(values.values()),
                "lost_among_solvable": sum(not values[t] for t in solvable),
                "lost_tasks": [t for t in solvable if not values[t]],
            }
            for name, values in solved.items()
        },
        "comparisons": [
            compare(solved, "critique", "agreement+critique"),
            compare(solved, "agreement+critique", "answered+critique"),
            compare(solved, "answered+critique", "answered+nearest+critique"),
        ],
        "per_task": {
            name: sorted(t for t, ok in values.items() if ok) for name, values in solved.items()
        },
    }
    if args.explain:
        explain(mode, solved, solvable, trees, tasks, passed, selectors)
    if scored:
        result["comparisons"].append(compare(solved, "verifier", "agreement+verifier"))
        result["comparisons"].append(compare(solved, "agreement+verifier", "answered+verifier"))
        result["comparisons"].append(compare(solved, "critique", "verifier"))
        result["comparisons"].append(
            compare(solved, "answered+verifier", "answered+nearest+verifier")
        )
    return result


def explain(
    mode: str,
    solved: dict[str, dict[str, bool]],
    solvable: list[str],
    trees: list[Trajectory],
    tasks: dict[str, Task],
    passed: dict[tuple[str, str], bool],
    selectors: dict[str, TieBreak],
) -> None:
    """Each solvable task some agreement selector lost: its tied programs, their behaviour
    group, how many probes they answered, their samples, whether they pass all tests, and the
    tie-break's score (the verifier's where there is one)."""
    from codeq.search.agreement import AgreementTieBreak

    agreement = selectors.get("agreement+verifier") or selectors["agreement+critique"]
    assert isinstance(agreement, AgreementTieBreak)
    lost = sorted(
        {t for name, values in solved.items() if "+" in name for t in solvable if not values[t]}
    )
    for tree in [tree for tree in trees if tree.task_id in lost]:
        task = tasks[tree.task_id]
        tied = tied_nodes(tree)
        programs = tuple(tied_programs(tree))
        group_of = agreement.cache.get((task.task_id, programs), {})
        losers = [name for name, values in solved.items() if not values[task.task_id]]
        print(f"{mode} {task.task_id} ({task.slug}), lost by {', '.join(losers)}:", flush=True)
        scores = dict(zip((node.program for node in tied), agreement.then(task, tied), strict=True))
        for program in programs:
            group, answered = group_of.get(program, (None, None))
            samples = sum(node.program == program for node in tied)
            score = scores[program]
            print(
                f"  group {group}, {answered} probes answered, {samples} sample(s), "
                f"passes all tests: {passed[(task.task_id, program)]}, tie-break score "
                f"{score:.3f}",
                flush=True,
            )


def decision(results: dict[str, Any]) -> dict[str, Any] | None:
    """The declared rule (RULE) applied to best-of-16's forest; None without its verifier."""
    bon = results.get("bon")
    if bon is None or not bon["verifier_scores"]:
        return None
    (against,) = [c for c in bon["comparisons"] if c["baseline"] == "verifier"]
    adopt = against["gained"] > against["lost"]
    return {
        "rule": RULE,
        "adopt": adopt,
        "gained": against["gained"],
        "lost": against["lost"],
        "p_better": against["p_better"],
    }


def answered_decision(results: dict[str, Any]) -> dict[str, Any] | None:
    """The second declared rule (ANSWERED_RULE); None without best-of-16's verifier."""
    return change_decision(results, ANSWERED_RULE, "answered+verifier", "answered+critique")


def nearest_decision(results: dict[str, Any]) -> dict[str, Any] | None:
    """The fourth declared rule (NEAREST_RULE); None without best-of-16's verifier."""
    return change_decision(
        results, NEAREST_RULE, "answered+nearest+verifier", "answered+nearest+critique"
    )


def change_decision(
    results: dict[str, Any], rule: str, with_verifier: str, with_critique: str
) -> dict[str, Any] | None:
    """A rule on a change to the selectors: `with_verifier` (the change, then the verifier)
    against the selector it changes on best-of-16's forest, and `with_critique` against its own
    on every other forest (each forest's comparison whose `other` it is: one per forest), read
    by gain_without_loss; None without best-of-16's verifier."""
    bon = results.get("bon")
    if bon is None or not bon["verifier_scores"]:
        return None
    (against,) = [c for c in bon["comparisons"] if c["other"] == with_verifier]
    elsewhere = {
        mode: next(c["lost"] for c in forest["comparisons"] if c["other"] == with_critique)
        for mode, forest in results.items()
        if mode != "bon"
    }
    return gain_without_loss(rule, against, elsewhere)


def gain_without_loss(
    rule: str, against: dict[str, Any], elsewhere: dict[str, int], **extra: Any
) -> dict[str, Any]:
    """A rule that adopts a change gaining more best-of-16 tasks than it loses (`against`) and
    losing none on the other forests (`elsewhere`: mode -> tasks lost), with what it read."""
    return {
        "rule": rule,
        **extra,
        "adopt": against["gained"] > against["lost"] and not any(elsewhere.values()),
        "gained": against["gained"],
        "lost": against["lost"],
        "p_better": against["p_better"],
        "lost_elsewhere": elsewhere,
    }


def against_baseline(
    results: dict[str, Any], baseline: dict[str, Any], probes: int
) -> dict[str, list[dict[str, Any]]]:
    """Per forest, the selectors PROBES_RULE reads (answered then verifier on best-of-16,
    answered then critique everywhere) paired per task: the baseline run's answers against this
    run's, each named with its probe count ('answered+verifier@8')."""
    earlier_probes = int(baseline["args"]["probes"])
    paired = {}
    for mode, forest in results.items():
        earlier = baseline["forests"].get(mode)
        if earlier is None:
            continue
        comparisons = []
        for selector in RULED_SELECTORS.get(mode, ["answered+critique"]):
            if selector not in forest["per_task"] or selector not in earlier["per_task"]:
                continue
            before, after = f"{selector}@{earlier_probes}", f"{selector}@{probes}"
            solved_before = set(earlier["per_task"][selector])
            solved_after = set(forest["per_task"][selector])
            everything = solved_before | solved_after
            solved = {
                before: {task: task in solved_before for task in everything},
                after: {task: task in solved_after for task in everything},
            }
            comparisons.append(compare(solved, before, after))
        paired[mode] = comparisons
    return paired


def probes_decision(paired: dict[str, list[dict[str, Any]]], probes: int) -> dict[str, Any] | None:
    """The third declared rule (PROBES_RULE) on `against_baseline`'s comparisons; None without
    best-of-16's verifier answers."""
    bon = [c for c in paired.get("bon", []) if c["baseline"].startswith("answered+verifier@")]
    if not bon:
        return None
    (against,) = bon
    elsewhere = {
        mode: sum(c["lost"] for c in comparisons)
        for mode, comparisons in paired.items()
        if mode != "bon"
    }
    return gain_without_loss(PROBES_RULE, against, elsewhere, probes=probes)


def main(argv: list[str] | None = None) -> int:
    from codeq.config import SandboxConfig
    from codeq.sandbox import Sandbox
    from codeq.schemas import read_jsonl

    args = parse_args(argv)
    started = time.perf_counter()
    path = args.store / "runs" / args.run / f"round-{args.round}" / "tasks" / "validation.jsonl"
    tasks = {task.task_id: task for task in read_jsonl(path, Task)}
    verifier = CommittedScores(args.scores) if args.scores else None
    results = {}
    with Sandbox(SandboxConfig(workers=args.workers)) as sandbox:
        for mode, trees in forests(args.trees).items():
            results[mode] = measure_forest(mode, trees, tasks, verifier, sandbox, args)
            print(f"{mode}: {json.dumps(results[mode]['selectors'])}", flush=True)
    record: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/answer_selection.py "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "args": {key: str(value) for key, value in vars(args).items()},
        "tasks": len(tasks),
        "forests": results,
        "decision": None,
        "answered_decision": None,
        "probes_decision": None,
        "nearest_decision": None,
    }
    if args.baseline is None:
        record["decision"] = decision(results)
        record["answered_decision"] = answered_decision(results)
        record["nearest_decision"] = nearest_decision(results)
    else:  # the comparisons PROBES_RULE reads replace the run's own (the ledger counts these)
        paired = against_baseline(results, json.loads(args.baseline.read_text()), args.probes)
        for mode, comparisons in paired.items():
            results[mode]["comparisons"] = comparisons
        record["probes_decision"] = probes_decision(paired, args.probes)
    record["seconds"] = round(time.perf_counter() - started, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    if record["decision"] is not None:
        print(f"decision (declared rule): adopt = {record['decision']['adopt']}", flush=True)
    if record["answered_decision"] is not None:
        adopt = record["answered_decision"]["adopt"]
        print(f"answered probes first (second declared rule): adopt = {adopt}", flush=True)
    if record["nearest_decision"] is not None:
        adopt = record["nearest_decision"]["adopt"]
        print(f"the nearest rewrite first (fourth declared rule): adopt = {adopt}", flush=True)
    if record["probes_decision"] is not None:
        adopt = record["probes_decision"]["adopt"]
        print(f"{args.probes} probes (third declared rule): adopt = {adopt}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
