"""Which search collects (issue 37, item 4): one round per search mode, at equal programs.

From the base model and the learning curve's round-0 train tasks (restored from git), each arm
collects with one search mode at the curve's budget (MCTS's rollouts x K rewrites: 8 programs a
task; best-of-8; multi-turn best-of-N, 4 samples a turn up to 2 turns), then runs the product's
own pairs, train (the curve's chosen learning rate and pairs.alpha) and evaluate stages, and its
candidate is decided against the base model on the validation tasks by the curve's promotion
rule from round 11 on (the greedy answer and k sampled answers a task, exact sign-flip test on
per-task pass counts). MCTS's arm is the curve's committed round 0 (its collect, pairs and
adapter, copied into the arm's run), evaluated again under that rule. Every arm is evaluated
under MCTS's arm's config, so the base model is searched once, by MCTS's arm, and the other arms
start from its trees. The rule declared in
docs/results/search-modes/README.md ("Collection's search mode"): `search.mode` becomes the mode
whose candidate passes the most validation answers if it beats MCTS's candidate paired per task
(sign-flip p < 0.05); otherwise `mcts` stays.

    # after the curve's rounds are in the store (bench/learning_curve.py ... --restore-only)
    OMP_WAIT_POLICY=ACTIVE python bench/collection_modes.py \\
        --json docs/results/collection-modes/decision.json -- <the curve's options>

Each arm is its own run in the curve's store (`collect-<mode>`), so its stages resume after an
interruption (rerun the same command). A finished arm writes `<mode>.json` (its collect, pairs,
training and decision) and its validation results per task beside `--json`; an arm whose file
is there is read, not run again, on any machine. The round's evaluate stage also scores the
spent first test tasks as every round does; this bench reads only validation.

An arm takes longer than a machine may live (MCTS's evaluation of the candidate and the base
model alone about 5.5 h a policy on 2 cores), so the same command with `--persist` (beside the
run, or after it stopped) copies each unfinished arm's store objects (its finished stages and the
evaluation trees saved so far) into `progress/collect-<mode>/` beside `--json`, listed with their
sha256 in `partial.json` as bench/curve_rounds.py keeps a curve's rounds; the next run on any
machine puts them back into its store first and goes on from there. A finished arm's folder is
spent and removed, except MCTS's evaluation: the base model's trees every other arm starts from.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import curve_rounds  # noqa: E402  (bench/ is not a package)
import learning_curve  # noqa: E402

ARMS = ("mcts", "bon", "mt_bon")
NEW_ARM_STAGES = ("collect", "pairs", "train", "evaluate", "promote")
COPIED_ARM_STAGES = ("evaluate", "promote")  # MCTS's arm: the curve's round 0, decided again
# Every arm is evaluated and decided under MCTS's arm's config: the promotion modes (single
# pass) read no search-mode setting, and the base model's trees are then the same for every arm.
JUDGING_STAGES = ("evaluate", "promote")
MT_BON_TURNS = 2
LEVEL = 0.05  # the declared rule's
PROGRESS_DIR = "progress"  # beside --json: the arms' store objects, for git
MCTS_KEPT_STAGE = "eval"  # of a finished MCTS arm: the base model's trees the others reuse


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="the decision goes here")
    parser.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS), help="search modes to collect with"
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=8,
        help="sampled validation answers a task beside the greedy one (the curve's rule)",
    )
    parser.add_argument(
        "--persist",
        action="store_true",
        help="copy each unfinished arm's store objects into progress/ beside --json for git, "
        "then exit (a run may go on meanwhile; the next run on any machine restores them)",
    )
    parser.add_argument("curve", nargs=argparse.REMAINDER, help="-- then the curve's options")
    args = parser.parse_args(argv)
    curve_argv = args.curve[1:] if args.curve[:1] == ["--"] else args.curve
    if "mcts" not in args.arms:
        parser.error("--arms must include mcts: every other arm is paired against it")
    if args.samples < 1:
        parser.error("--samples must be at least 1: the rule is the sign-flip test on pass counts")
    return args, learning_curve.sized(learning_curve.parse_args(curve_argv))


def arm_run(mode: str) -> str:
    return f"collect-{mode}"


def programs_of(search: Any) -> int:
    """The most programs the curve's MCTS writes a task: every arm's budget."""
    return int(search.rollouts * search.rewrites_per_expansion)


def arm_config(base: Any, mode: str, samples: int) -> Any:
    """The curve's config (its learning rate and pairs.alpha already in) for one arm: its search
    mode at MCTS's budget, promotion on greedy + `samples` sampled answers."""
    programs = programs_of(base.search)
    search = {"mode": mode}
    if mode == "bon":
        search["bon_samples"] = programs
    if mode == "mt_bon":
        search.update(
            {"mt_bon_samples": max(1, programs // MT_BON_TURNS), "mt_bon_turns": MT_BON_TURNS}
        )
    return base.model_copy(
        update={
            "search": base.search.model_copy(update=search),
            "promotion": base.promotion.model_copy(update={"samples": samples}),
        }
    )


def curve_config(curve_args: argparse.Namespace) -> Any:
    """The curve's round-0 config with what its results chose on round 0 (learning rate, alpha)."""
    from codeq.config import load_config

    results = curve_args.results
    for name in ("learning-rate.json", "pairs-alpha.json"):
        if not (results / name).is_file():
            raise SystemExit(
                f"error: {results / name} is missing: these arms use the curve's round-0 "
                "choices; pass the curve's --results"
            )
    chosen = json.loads((results / "learning-rate.json").read_text())
    rate = next(t["learning_rate"] for t in chosen["trials"] if t["run"] == chosen["chosen_run"])
    alpha = float(json.loads((results / "pairs-alpha.json").read_text())["alpha"])
    config = load_config(None, learning_curve.curve_settings(curve_args))
    return (
        config.model_copy(
            update={
                "train": config.train.model_copy(update={"learning_rate": rate}),
                "pairs": config.pairs.model_copy(update={"alpha": alpha}),
            }
        ),
        str(chosen["chosen_run"]),
    )


class Arms:
    """The arms' stages against the curve's store, each skipped when its output is complete."""

    def __init__(self, curve_args: argparse.Namespace, config: Any, chosen_run: str) -> None:
        from codeq.store import open_store

        self.out = curve_args.out
        self.config = config
        self.chosen_run = chosen_run
        self.store = open_store(config.store)
        self.engines: dict[str, Any] = {}

    def ctx(self, mode: str, config: Any) -> Any:
        from codeq.pipeline.stages import StageContext

        return StageContext(
            config=config.as_round(0, arm_run(mode)),
            store=self.store,
            scratch=self.out / "work" / arm_run(mode),
            engines=self.engines,
        )

    def require_round_0(self) -> None:
        from codeq.store import RoundLayout

        needed = [RoundLayout(learning_curve.BASE_RUN, 0).stage(n) for n in ("tasks", "pairs")]
        needed.append(RoundLayout(self.chosen_run, 0).stage("adapter"))
        missing = [key for key in needed if not self.store.is_complete(key)]
        if missing:
            raise SystemExit(
                f"error: the curve's round 0 is not in the store ({missing[0]} is missing): run "
                "bench/learning_curve.py with the same options and --restore-only first"
            )

    def run(self, mode: str, samples: int) -> dict[str, Any]:
        """One arm's stages (resumed where they stopped); its record."""
        from codeq.pipeline.stages import STAGE_FUNCTIONS

        stages = COPIED_ARM_STAGES if mode == "mcts" else NEW_ARM_STAGES
        learning_curve.copy_round_0(
            self.store, self.out / "work" / "copies", self.copied(mode), arm_run(mode)
        )
        ctx = self.ctx(mode, arm_config(self.config, mode, samples))
        judge = self.ctx(mode, arm_config(self.config, "mcts", samples))
        for stage in stages:
            stage_ctx = judge if stage in JUDGING_STAGES else ctx
            key = ctx.layout.stage(learning_curve.STAGE_OUTPUTS.get(stage, stage))
            if self.store.is_complete(key):
                print(f"[arms] {mode}: {stage} done earlier", file=sys.stderr, flush=True)
                continue
            if stage == "evaluate" and mode != "mcts":
                self.reuse_base_trees(mode, judge)
            print(f"[arms] {mode}: {stage}", file=sys.stderr, flush=True)
            STAGE_FUNCTIONS[stage](stage_ctx)
        return self.record(mode, ctx)

    def copied(self, mode: str) -> dict[str, str]:
        """The round-0 stages an arm copies from the curve's runs (stage output -> its run):
        the tasks, and for MCTS's arm the curve's round 0 as it collected, paired and trained."""
        base = learning_curve.BASE_RUN
        if mode != "mcts":
            return {"tasks": base}
        return {
            "tasks": base,
            "trajectories/shard-0": base,
            "pairs": base,
            "adapter": self.chosen_run,
        }

    def own_keys(self, mode: str, only_stage: str | None = None) -> list[str]:
        """The arm's store objects worth keeping in git: its stages' outputs and the evaluation
        trees saved so far, not what it copied from the curve's rounds (git holds those) nor a
        train's checkpoints (`curve_rounds.kept_partial`); `only_stage`: that stage's alone."""
        prefix = f"runs/{arm_run(mode)}/round-0"
        copied = tuple(f"{name}/" for name in self.copied(mode))
        keys = []
        for key in self.store.list(prefix):
            inside = curve_rounds.stage_relative(key)
            if inside.startswith(copied) or not curve_rounds.kept_partial(key):
                continue
            if only_stage is None or inside.startswith(f"{only_stage}/"):
                keys.append(key)
        return keys

    def persist(self, folder: Path, mode: str, samples: int, finished: bool) -> str:
        """The arm's objects into `progress_folder` (replacing an earlier copy): all of an
        unfinished arm's, a finished MCTS arm's evaluation; a finished other arm's folder is
        spent and removed. One line saying what was kept."""
        target = progress_folder(folder, mode)
        shutil.rmtree(target, ignore_errors=True)
        if finished and mode != "mcts":
            return f"[arms] {mode}: finished, nothing of its store kept beside {folder}"
        keys = self.own_keys(mode, MCTS_KEPT_STAGE if finished else None)
        if not keys:
            return f"[arms] {mode}: nothing in the store yet"
        settings = arm_config(self.config, mode, samples).model_dump(mode="json")
        curve_rounds.write_record(
            self.store, target / curve_rounds.PARTIAL_FILE, 0, [arm_run(mode)], settings, {}, keys
        )
        return f"[arms] {mode}: {len(keys)} store objects kept in {target}"

    def restore(self, folder: Path, mode: str, samples: int) -> None:
        """Put an arm's kept objects into the store (those it lacks; those it holds must hold the
        same content), before the arm runs on this machine."""
        record = progress_folder(folder, mode) / curve_rounds.PARTIAL_FILE
        if not record.is_file():
            return
        settings = arm_config(self.config, mode, samples).model_dump(mode="json")
        entry = curve_rounds.read_committed(folder, 0, settings, record)
        put = curve_rounds.put_missing(self.store, record.parent, entry, 0, record)
        if put:
            print(
                f"[arms] {mode}: {put} store objects restored from {record.parent}",
                file=sys.stderr,
                flush=True,
            )

    def reuse_base_trees(self, mode: str, judge: Any) -> None:
        """The base model's trees MCTS's finished arm searched (the same policy under the same
        evaluation config, so the same seeded trees), copied in as this arm's evaluation's
        resume state for its incumbent: the product uses them only where their resume key
        matches, answers and scores them again, and searches whatever they lack."""
        from codeq.evaluate.run import is_resume_file
        from codeq.pipeline.stages import EVAL_SPLITS, copy_resume_state

        source = self.ctx("mcts", self.config).layout.stage("eval")
        if not self.store.is_complete(source):
            return
        files = self.store.read_manifest(source)["files"]
        for split in EVAL_SPLITS:
            target = judge.workdir("eval") / "incumbent" / split
            if any(is_resume_file(path.name) for path in target.glob("*")):
                continue  # this arm's own progress comes first
            copied = copy_resume_state(self.store, source, files, f"incumbent/{split}", target)
            if copied:
                print(
                    f"[arms] {mode}: the base model's {split} trees reused from "
                    f"{arm_run('mcts')} ({copied} files)",
                    file=sys.stderr,
                    flush=True,
                )

    def record(self, mode: str, ctx: Any) -> dict[str, Any]:
        """What the arm did, read from its store objects while they are here."""
        layout = ctx.layout
        decision = self.store.get_json(layout.stage("promote") + "/decision.json")
        pairs = self.store.get_json(layout.stage("pairs") + "/stats.json")
        trained = decision.get("candidate") is not None  # a collect without pairs trains none
        train = self.store.get_json(layout.stage("adapter") + "/metrics.json") if trained else {}
        collect = self.store.marker(layout.stage("trajectories/shard-0"))
        search = ctx.config.search
        return {
            "mode": mode,
            "run": layout.run,
            "programs_at_most": programs_of(search),
            "search": search.model_dump(mode="json"),
            "collect": collect,
            "pairs": pairs.get("pairs"),
            "pairs_stats": pairs,
            "learning_rate": (train.get("config") or {}).get("learning_rate"),
            "global_steps": train.get("global_steps"),
            "decision": decision,
        }

    def validation_results(self, mode: str, role: str, target: Path) -> Path:
        """The arm's `role` ('candidate' or 'incumbent') validation results, copied to `target`."""
        prefix = self.ctx(mode, self.config).layout.stage("eval")
        if not self.store.get_verified_file(prefix, f"{role}/validation/results.json", target):
            raise SystemExit(f"error: {prefix} holds no {role}/validation/results.json")
        return target


def progress_folder(folder: Path, mode: str) -> Path:
    """Where an arm's store objects are kept for git (`Arms.persist`)."""
    return folder / PROGRESS_DIR / arm_run(mode)


def arm_files(folder: Path, mode: str) -> tuple[Path, Path, Path]:
    """An arm's record and its candidate's and the base model's validation results."""
    return (
        folder / f"{mode}.json",
        folder / f"{mode}-candidate-validation.json",
        folder / f"{mode}-base-validation.json",
    )


def decide(arms: dict[str, dict[str, Any]], folder: Path, samples: int) -> dict[str, Any]:
    """The declared rule on the arms' validation results: the candidate passing the most
    answers, paired against MCTS's candidate per task (sign-flip); `search.mode` moves to it
    only when p < LEVEL."""
    from codeq.evaluate.results import EvalResults
    from codeq.promotion import compare_modes, pass_counts

    gate = arms["mcts"]["decision"]["gate_mode"]
    trained = [mode for mode, arm in arms.items() if arm["decision"]["candidate"] is not None]
    if "mcts" not in trained:
        raise SystemExit("error: MCTS's arm has no candidate, so no arm can be paired against it")
    candidates = {
        mode: EvalResults.load(arm_files(folder, mode)[1]).modes[gate] for mode in trained
    }
    passes = {
        mode: sum(pass_counts(gate, result, samples, mode).values())
        for mode, result in candidates.items()
    }
    best = max(passes, key=lambda mode: (passes[mode], mode == "mcts"))
    rows = [
        compare_modes(f"{mode} vs mcts", candidates[mode], candidates["mcts"], samples)
        for mode in trained
        if mode != "mcts"
    ]
    against_mcts = next((row for row in rows if row.mode == f"{best} vs mcts"), None)
    adopted = against_mcts is not None and against_mcts.p_better < LEVEL
    if best == "mcts":
        verdict = "MCTS's candidate passes the most validation answers: search.mode stays mcts"
    elif adopted:
        verdict = (
            f"{best}'s candidate passes the most validation answers ({passes[best]} against "
            f"MCTS's {passes['mcts']}) and beats MCTS's per task (sign-flip p = "
            f"{against_mcts.p_better:.3g}): search.mode becomes {best}"
        )
    else:
        verdict = (
            f"{best}'s candidate passes the most validation answers ({passes[best]} against "
            f"MCTS's {passes['mcts']}) but not significantly more per task (sign-flip p = "
            f"{against_mcts.p_better:.3g} >= {LEVEL}): search.mode stays mcts"
        )
    untrained = [mode for mode in arms if mode not in trained]
    if untrained:  # no pairs, no adapter: nothing of its own to choose
        verdict += f" ({', '.join(untrained)}: no candidate, its collect gave no pairs)"
    return {
        "gate_mode": gate,
        "samples": samples,
        "passes": passes,
        "without_candidate": untrained,
        "best": best,
        "against_mcts": [row.model_dump(mode="json") for row in rows],
        "search_mode": best if adopted else "mcts",
        "verdict": verdict,
    }


def table(arms: dict[str, dict[str, Any]], decision: dict[str, Any]) -> str:
    lines = [
        "| arm (programs a task) | pairs | candidate vs base: passes of answers | tasks more / fewer | p (better) | promoted |",
        "|---|---:|---|---|---:|---|",
    ]
    for mode, arm in arms.items():
        if arm["decision"]["candidate"] is None:
            lines.append(
                f"| {mode} ({arm['programs_at_most']}) | {arm['pairs']} | no candidate | | | |"
            )
            continue
        [gate] = [c for c in arm["decision"]["comparisons"] if c["mode"] == decision["gate_mode"]]
        counts = gate["pass_counts"]
        lines.append(
            f"| {mode} ({arm['programs_at_most']}) | {arm['pairs']} | "
            f"{counts['candidate_passes']} against {counts['incumbent_passes']} of "
            f"{counts['answers']} | +{counts['tasks_better']} / -{counts['tasks_worse']} | "
            f"{gate['p_better']:.3g} | {arm['decision']['promote']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from codeq.errors import CodeQError
    from codeq.logs import report_error

    try:
        compare_arms(argv)
    except CodeQError as exc:  # one error: line and a hint, as the CLI prints them
        sys.exit(report_error(exc, traceback=False))


def compare_arms(argv: list[str] | None) -> None:
    args, curve_args = parse_args(argv)
    folder = args.json.parent
    folder.mkdir(parents=True, exist_ok=True)
    config, chosen_run = curve_config(curve_args)
    runner = Arms(curve_args, config, chosen_run)
    modes = sorted(args.arms, key=lambda m: m != "mcts")  # MCTS's first: the rest face it
    if args.persist:
        for mode in modes:
            if not arm_files(folder, mode)[0].is_file():
                print(runner.persist(folder, mode, args.samples, finished=False))
        return
    arms: dict[str, dict[str, Any]] = {}
    for mode in modes:
        record, candidate, base = arm_files(folder, mode)
        runner.restore(folder, mode, args.samples)  # kept in git by an earlier machine
        if record.is_file():  # finished earlier, on this machine or another (git)
            arms[mode] = json.loads(record.read_text())
            print(f"[arms] {mode}: read from {record}", file=sys.stderr, flush=True)
            continue
        runner.require_round_0()
        arms[mode] = runner.run(mode, args.samples)
        if arms[mode]["decision"]["candidate"] is not None:  # else validation was not run
            runner.validation_results(mode, "candidate", candidate)
            runner.validation_results(mode, "incumbent", base)
        learning_curve.write_result(record, arms[mode])
        print(runner.persist(folder, mode, args.samples, finished=True), file=sys.stderr)
    decision = decide(arms, folder, args.samples)
    learning_curve.write_result(
        args.json,
        {
            "command": "python bench/collection_modes.py " + " ".join(argv or sys.argv[1:]),
            "arms": {mode: arm_files(folder, mode)[0].name for mode in arms},
            **decision,
        },
    )
    print(table(arms, decision))
    print(decision["verdict"])


if __name__ == "__main__":
    main()
