"""The learning curve of a real code model: does search help, does each chained round of DPO help?

Runs the product's own round (prepare -> collect -> pairs -> train -> evaluate -> promote ->
report, against a local store) for `--rounds` chained rounds, each starting from the policy the
earlier rounds promoted, and evaluates on the same test tasks the base model and every policy a
round promoted: zero_shot, full_rewrite, MCTS at budgets 1/2/4/8 and best-of-N at the same
numbers of programs (single-pass modes right after each round, the search modes once every
round has trained). Decisions (promotion, the learning rate) use the validation split only; the
test split is reported. Every part is resumable (stages keep completion markers, collect keeps
each finished task): rerun the same command after an interruption and it continues.

    # Qwen2.5-Coder-0.5B (see ../shared/models/README.md), DebugBench: hours on 2 CPU cores
    nohup python bench/learning_curve.py > curve.log 2>&1 &
    # the tiny version the test suite runs (SmolLM2, builtin tasks): about 3 minutes (2 cores)
    python bench/learning_curve.py --tiny --out /tmp/curve-tiny --results /tmp/curve-tiny/results

Results (small JSON files, committed as each part finishes): `<results>/<policy>-test.json`
(each evaluated policy's full results, per task), `round-N.json` (each finished round's pairs,
training and validation decision), `learning-rate.json`, `pairs-alpha.json`, `timings.json`, and
`summary.json` with every number (rewritten after each round); the table is printed at the end
and is what docs/results.md shows. The store (trajectories, adapters) stays on the machine; on
another one the curve reruns its stages but keeps what the results already decided (the
learning rate: only the chosen run trains again) and measured (a test evaluation of the same
policy is not redone), and says whether each round's candidate came out identical to the one
its round-N.json recorded.

    # the summary and the table from a clone's result files alone
    python bench/learning_curve.py --summary-only --results docs/results/learning-curve
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import curve_rounds  # noqa: E402  (bench/ is not a package)

QWEN_GGUF = Path.home() / ".cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEBUGBENCH = REPO.parent / "shared" / "debugbench"
# bon before mcts: a curve cut short between the two still holds the baseline MCTS is judged by
TEST_MODES = ["zero_shot", "full_rewrite", "bon", "mcts"]
# Declared 2026-11-29 (docs/results.md, "The order after the chain"): on the untouched test
# tasks the search modes run once, as issue 37's validation decisions chose them (which search
# answers, and what breaks its ties), not at this curve's pinned search and self-critique.
SEARCH_MODES_WAIT = (
    "test measurement: single pass done; the search modes' one test run is issue 37's decided "
    "search, not this curve's, so it is not run here (docs/results.md, 'The order after the "
    "chain', says what it runs)"
)
# What a round's DPO is meant to change, measured right after the round; the search modes (hours
# on CPU) follow once every round has trained, so an interrupted curve answers "did DPO help"
# first. The later full pass evaluates only the modes a policy's result file lacks.
SINGLE_PASS_MODES = ["zero_shot", "full_rewrite"]
BASE_RUN = "curve"  # round 0's tasks, trajectories and pairs; each learning rate's run copies them


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "codeq-runs" / "curve")
    parser.add_argument(
        "--results", type=Path, default=REPO / "docs" / "results" / "learning-curve"
    )
    parser.add_argument("--model", default=str(QWEN_GGUF))
    parser.add_argument("--source", default=str(DEBUGBENCH))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--stop-after-promotions",
        type=int,
        default=0,
        metavar="K",
        help="end the chain of rounds early once K rounds in a row have been promoted (the "
        "claim the curve tests: round N+1, sampled from round N's promoted policy, is better "
        "again), or once the rounds left cannot make K in a row; then the after-chain test "
        "runs. 0: run all --rounds",
    )
    parser.add_argument(
        "--promotion-samples",
        type=int,
        default=0,
        metavar="K",
        help="promotion.samples of the rounds from --promotion-samples-from on: K sampled "
        "validation answers per task beside the greedy one, decided by the exact sign-flip "
        "test on pass counts (docs/promotion-power.md: 8 sees a +5-point gain on 143 tasks "
        "in 88%% of rounds, greedy McNemar in 52%%). 0: greedy McNemar, the rule every curve "
        "began with",
    )
    parser.add_argument(
        "--promotion-samples-from",
        type=int,
        default=0,
        metavar="ROUND",
        help="the first round --promotion-samples decides (a chain that goes on under a "
        "rule declared after its earlier rounds: those keep the rule they were decided by)",
    )
    parser.add_argument(
        "--replay-rounds",
        type=int,
        default=0,
        metavar="K",
        help="train.earlier_rounds of the rounds from --replay-from on: DPO trains on the "
        "round's pairs and those of the K rounds before it (a kept-out round's pairs were "
        "written by the policy the next round samples from). 0: each round's pairs alone, as "
        "every curve began",
    )
    parser.add_argument(
        "--replay-from",
        type=int,
        default=0,
        metavar="ROUND",
        help="the first round --replay-rounds trains (the rounds before keep what they trained on)",
    )
    parser.add_argument(
        "--sft-weight",
        type=float,
        default=0.0,
        metavar="W",
        help="train.sft_weight of the rounds from --sft-from on: the chosen programs' "
        "negative log-likelihood beside DPO with weight W (iterative RPO; the committed rounds "
        "show DPO lowering the chosen programs' likelihood in 13 of 15 rounds). 0: DPO alone, "
        "as every curve began",
    )
    parser.add_argument(
        "--sft-from",
        type=int,
        default=0,
        metavar="ROUND",
        help="the first round --sft-weight trains (the rounds before keep what they trained with)",
    )
    parser.add_argument("--test-tasks", type=int, default=60)
    parser.add_argument(
        "--validation-tasks",
        type=int,
        default=None,
        help="validation tasks that decide promotion (default: the whole validation split). "
        "The curve of docs/results.md used 40 and continues with --validation-tasks 40; at 40 "
        "it kept out a round whose gain 137 other test tasks showed significant",
    )
    parser.add_argument("--train-tasks", type=int, default=100, help="collected per round")
    parser.add_argument(
        "--learning-rates",
        default="1e-4",
        help="LoRA learning rates tried in round 0 (comma-separated); the one whose candidate "
        "solves the most validation tasks trains every round (a single value skips the "
        "choice). 1e-4 promoted on validation in the curve of docs/results.md; 5e-6, the "
        "config's default, moves a LoRA 20 times less in round 0's 6 steps",
    )
    parser.add_argument("--seed", type=int, default=0, help="search seed")
    parser.add_argument(
        "--search-settings",
        choices=["first-curves", "defaults"],
        default="first-curves",
        help="'first-curves' pins the search the first two curves of docs/results.md began "
        "with (the detailed first turn, no widening, multi-turn refinement); 'defaults' "
        "searches with today's config defaults, chosen on validation since (the third curve)",
    )
    parser.add_argument(
        "--test-after-chain",
        action="store_true",
        help="no test evaluation of the curve's own while its rounds run (each round's "
        "evaluate stage still reports its first --test-tasks test tasks): every promoted "
        "policy, then every kept-out candidate, is measured single pass on test once, after "
        "the last round, on the test tasks after the first --test-skip; the search modes are "
        "left to their own run with the search validation chose",
    )
    parser.add_argument(
        "--test-skip",
        type=int,
        default=0,
        help="with --test-after-chain: leave out the first N test tasks (the first curves' "
        "60 are spent: many paired tests and the ideas behind several defaults looked at them)",
    )
    parser.add_argument("--tiny", action="store_true", help="SmolLM2 and builtin tasks, minutes")
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="rebuild summary.json and the table from the result files alone (no model, no store)",
    )
    parser.add_argument(
        "--check-rates",
        metavar="RATES",
        help="after the curve chose its learning rate: train round 0 with these rates too "
        "(comma-separated), each evaluated on validation like the trials, and record them in "
        "learning-rate.json under 'checked_after_choice'; the chosen run stays what it was",
    )
    parser.add_argument(
        "--search-candidates",
        type=int,
        nargs="+",
        default=[],
        metavar="ROUND",
        help="after the curve: the search modes (MCTS, best-of-N) on test of the candidates "
        "these rounds trained and validation kept out, beside their single pass (reported, "
        "never used). In docs/results.md, round 1's: the whole validation split promotes it",
    )
    parser.add_argument(
        "--persist-rounds",
        action="store_true",
        help="write every finished round the store holds into <results>/rounds/ for git (as "
        "the curve does after each round; for a round that finished under older code) and exit",
    )
    parser.add_argument(
        "--persist-partial",
        action="store_true",
        help="write the round under way, as far as the store holds it (finished stages, the "
        "trees its collect saved so far), into <results>/rounds/round-N-partial/ for git, and "
        "exit; run beside the curve with its own options, so a fresh machine goes on from there",
    )
    parser.add_argument(
        "--with-checkpoint",
        action="store_true",
        help="with --persist-partial: also the last checkpoint of a train under way (stop the "
        "curve first; about 140 MB in git), so a fresh machine goes on from it instead of "
        "training the round again",
    )
    parser.add_argument(
        "--restore-only",
        action="store_true",
        help="put the rounds committed under <results>/rounds/ into the store, rebuild each "
        "one's tasks with prepare (checked against the split files' sha256 in git), and exit: "
        "what a bench that reads a round's tasks (bench/verifier_auc.py, bench/search_modes.py) "
        "needs on a fresh machine, without starting the next round",
    )
    parser.add_argument(
        "--restore-tasks",
        choices=("every-round", "held-out"),
        help="with --restore-only (refused without it): whose tasks prepare builds again: "
        "every committed round's (the default; bench/verifier_auc.py reads them), or held-out: "
        "round 0's alone (the validation and test tasks every round keeps, all that "
        "bench/search_modes.py reads besides the adapters), about a minute less a round",
    )
    parser.add_argument(
        "--write-eval-config",
        type=Path,
        metavar="FILE",
        help="write the curve's policy, search and evaluate settings as YAML for `codeq evaluate "
        "-c FILE` on another machine (the test evaluation on a GPU) and exit",
    )
    args = parser.parse_args(argv)
    if args.restore_tasks and not args.restore_only:
        parser.error("--restore-tasks chooses what --restore-only rebuilds; add --restore-only")
    args.restore_tasks = args.restore_tasks or "every-round"
    return args


# The train keys a segment of the curve sets from a given round on (round_settings), each with
# the value it has before: the config each round runs with takes them from there (round_rule).
ROUND_TRAIN_KEYS = {"earlier_rounds": 0, "sft_weight": 0.0}


def round_settings(args: argparse.Namespace, number: int) -> dict[str, Any]:
    """The config round `number` runs with: the curve's, under the promotion rule that
    decides that round (--promotion-samples from --promotion-samples-from on), its replay
    (--replay-rounds from --replay-from on) and its likelihood term (--sft-weight from
    --sft-from on)."""
    settings = curve_settings(args)
    if args.promotion_samples and number >= args.promotion_samples_from:
        settings["promotion"]["samples"] = args.promotion_samples
    if args.replay_rounds and number >= args.replay_from:
        settings["train"]["earlier_rounds"] = args.replay_rounds
    if args.sft_weight and number >= args.sft_from:
        settings["train"]["sft_weight"] = args.sft_weight
    return settings


def curve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The config of every round: production defaults, sized for a 2-core CPU."""
    settings: dict[str, Any] = {
        "tasks": {
            "source": args.source,
            "test_fraction": 0.15,
            "validation_fraction": 0.15,
            "train_per_round": args.train_tasks,
        },
        "policy": {
            "model": args.model,
            "max_new_tokens": 512,
            "critique_max_new_tokens": 24,
            "batch_size": 32,
            "backend": "engine",
        },
        "search": {
            "rewrites_per_expansion": 2,
            "rollouts": 4,
            "max_depth": 2,
            "parallel_trees": 16,
            "bon_samples": 8,
            "seed": args.seed,
        },
        # The self-critique gives Q_ai and breaks ties, as in every round committed: the learned
        # verifier became the default after round 12 (these are the values before it, at which
        # no key is fingerprinted, so the committed rounds stay this command's).
        "pairs": {"max_pairs_per_task": 2, "q_ai": "critique"},
        "verifier": {
            "enabled": False,
            "fallback": "error",
            "objective": "pointwise",
            "epochs": 2.0,
            "earlier_rounds": 0,
        },
        "train": {
            "lora_r": 16,
            "lora_alpha": 32,
            "per_device_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "max_length": 1536,
            "eval_fraction": 0.1,
            "eval_steps": 4,
        },
        "evaluate": {
            "modes": ["full_rewrite"],
            "rollout_ablation": [1, 2, 4, 8],
            "max_tasks": args.test_tasks,
            "tie_break": "critique",
            "agreement_probes": 0,  # execution agreement came after every committed round
        },
        # The rule the curves began with: greedy answers, no guard mode (keys added since, at
        # the values that reproduce it), and the engine that generated every round so far.
        "promotion": {
            "modes": ["full_rewrite"],
            "max_tasks": args.validation_tasks,
            "samples": 0,
            "guard_modes": [],
        },
        # one process, one cache: no copy of each merged policy in the local store
        "store": {
            "uri": f"file://{args.out.resolve() / 'store'}",
            "run": "curve",
            "keep_merged": False,
        },
    }
    if args.search_settings == "first-curves":
        # The first curves began before 'plain' became the default first turn, before
        # progressive widening (0.5) and the one-turn refinement: the same search in every
        # part of them (docs/results.md).
        settings["search"].update({"prompt": "detailed", "widening": 0.0, "refine": "multi_turn"})
    else:
        # A deterministic search takes its tasks in fixed groups of parallel_trees and finishes
        # each before the next (so that a resumed search is the uninterrupted one); groups as
        # large as the batch leave fewer half-empty batches at a group's end.
        settings["search"]["parallel_trees"] = settings["policy"]["batch_size"]
    if args.tiny:
        settings["tasks"].update({"test_fraction": 0.25, "validation_fraction": 0.25})
        # float32 and fp32: on a CPU without AMX, bf16 takes twice the time (docs/performance.md).
        # 32 new tokens still give every round pairs to train on (its siblings differ); 48 took a
        # quarter longer to search and evaluate, in the suite's longest test
        settings["policy"].update(
            {
                "max_new_tokens": 32,
                "critique_max_new_tokens": 8,
                "batch_size": 8,
                "dtype": "float32",
            }
        )
        settings["search"].update(
            {"rollouts": 1, "max_depth": 1, "bon_samples": 2, "parallel_trees": 4}
        )
        settings["pairs"]["min_value_gap"] = 0.0
        settings["train"].update(
            {
                "lora_r": 4,
                "lora_alpha": 8,
                # one step of one micro-batch (2 pairs): the default accumulation of 8 ran
                # three micro-batches of the tiny rounds' pairs, 22 s of each tiny train
                "gradient_accumulation_steps": 1,
                "max_steps": 1,
                "eval_fraction": 0.0,
                "max_length": 1024,
                "precision": "fp32",
            }
        )
        settings["evaluate"]["rollout_ablation"] = [1]
    return settings


class Curve:
    """The experiment's parts, each skipped when its output exists; times and ETA per part."""

    def __init__(self, args: argparse.Namespace) -> None:
        from codeq.config import load_config
        from codeq.pipeline.stages import StageContext
        from codeq.store import open_store

        self.args = args
        self.config = load_config(None, curve_settings(args))
        self.store = open_store(self.config.store)
        self.results = args.results
        self.results.mkdir(parents=True, exist_ok=True)
        self.engines: dict[str, Any] = {}
        self.context = StageContext
        self.state_path = self.results / "timings.json"
        self.timings: dict[str, float] = read_json_or(self.state_path, {})
        self.counted_modes: dict[str, set[str]] = {}  # policy name -> modes in the ETA's tally
        self.started = time.perf_counter()

    # ------------------------------------------------------------------ bookkeeping

    def part(self, name: str, weight: float, done: bool, work: Any) -> Any:
        """Run one part unless `done`; record its time; print progress with an ETA."""
        if done:
            self.finished_weight += weight
            print(f"[curve] {name}: done earlier, skipped", file=sys.stderr, flush=True)
            return None
        print(f"[curve] {name}: starting; {self.eta()}", file=sys.stderr, flush=True)
        began = time.perf_counter()
        value = work()
        seconds = time.perf_counter() - began
        self.timings[name] = round(seconds, 1)
        write_result(self.state_path, self.timings)
        self.finished_weight += weight
        self.run_weight += weight
        self.run_seconds += seconds
        print(f"[curve] {name}: took {seconds / 60:.1f} min", file=sys.stderr, flush=True)
        return value

    def eta(self) -> str:
        """Time left, from this process's pace over the parts it ran (by rough weights)."""
        if not self.run_weight:
            return "no ETA yet"
        left = self.run_seconds / self.run_weight * (self.total_weight - self.finished_weight)
        if left <= 0:  # parts past the planned ones (a restore's prepares)
            return "no ETA: past the planned parts"
        return f"about {left / 3600:.1f} h left"

    total_weight = 0.0
    finished_weight = 0.0
    run_weight = 0.0
    run_seconds = 0.0

    def ctx(self, round_number: int, run: str | None = None, config: Any = None) -> Any:
        config = self.round_rule(round_number, config or self.config)
        return self.context(
            config=config.as_round(round_number, run or self.run),
            store=self.store,
            scratch=self.args.out / "work" / (run or self.run),
            engines=self.engines,
        )

    run = BASE_RUN

    # ------------------------------------------------------------------ parts

    def stage(
        self, round_number: int, stage: str, run: str | None = None, config: Any = None
    ) -> None:
        from codeq.pipeline.stages import STAGE_FUNCTIONS

        ctx = self.ctx(round_number, run, config)
        key = STAGE_OUTPUTS.get(stage, stage)
        self.part(
            f"{ctx.layout.run} round {round_number} {stage}",
            WEIGHTS[stage],
            self.store.is_complete(ctx.layout.stage(key)),
            lambda: STAGE_FUNCTIONS[stage](ctx),
        )
        if stage == "prepare":  # a round committed to git must continue on the same tasks
            manifest = ctx.layout.stage("tasks/MANIFEST.json")
            self.keep_held_out_tasks(ctx, round_number)
            note = curve_rounds.check_tasks_preparing_again(
                self.store,
                self.results,
                round_number,
                manifest,
                lambda: self.prepare_again(ctx),
                lambda line: print(f"[curve] {line}", file=sys.stderr, flush=True),
            )
            if note:  # the tasks differ: this machine's manifest stays, true to its files
                print(f"[curve] {note}", file=sys.stderr, flush=True)
                carried = curve_rounds.carry_eval_progress(
                    self.store, self.results, round_number, manifest
                )
                if carried:
                    print(f"[curve] {carried}", file=sys.stderr, flush=True)
            elif curve_rounds.adopt_prepare_report(
                self.store, self.results, round_number, manifest
            ):
                print(
                    f"[curve] round {round_number}: the same tasks as its partial copy in git; "
                    "its prepare report adopted, so its collect progress goes on",
                    file=sys.stderr,
                    flush=True,
                )

    def prepare_again(self, ctx: Any) -> None:
        from codeq.pipeline.stages import STAGE_FUNCTIONS

        self.store.delete_prefix(ctx.layout.stage("tasks/"))
        STAGE_FUNCTIONS["prepare"](ctx)

    def keep_held_out_tasks(self, ctx: Any, round_number: int) -> None:
        """A round's validation and test tasks must be the curve's first round's."""
        tasks = (self.ctx(0).layout.stage("tasks"), ctx.layout.stage("tasks"))
        for note in curve_rounds.prepare_held_out_alike(
            self.store, self.results, round_number, tasks, lambda: self.prepare_again(ctx)
        ):
            print(f"[curve] {note}", file=sys.stderr, flush=True)

    def restore_rounds(self) -> None:
        """The rounds committed under <results>/rounds/, put into the store before anything
        runs, so the curve goes on after them instead of computing them again."""
        for number in curve_rounds.committed_rounds(self.results):
            began = time.perf_counter()
            put = curve_rounds.restore_round(
                self.store, self.results, number, self.settings(number)
            )
            print(
                f"[curve] round {number}: "
                + (
                    f"restored from git ({time.perf_counter() - began:.0f} s)"
                    if put
                    else "already in the store, the same as in git"
                ),
                file=sys.stderr,
                flush=True,
            )
        for number in curve_rounds.partial_rounds(self.results):
            put = curve_rounds.restore_partial(
                self.store, self.results, number, self.settings(number)
            )
            print(
                f"[curve] round {number} (unfinished): {put} objects restored from its partial "
                "copy in git",
                file=sys.stderr,
                flush=True,
            )

    def restored_finished(self, number: int) -> bool:
        """Whether round `number` (not round 0, whose held-out tasks every round keeps and the
        test measurement reads) came finished from git, so that going on needs none of its
        tasks and its prepare (about a minute a round) is left out; `--restore-only` still
        builds and checks every committed round's tasks. A verifier that learns from earlier
        rounds reads their tasks, so with one every round is prepared."""
        return (
            number > 0
            and not self.config.verifier.enabled
            and curve_rounds.finished_record(self.results, number).is_file()
            and self.store.is_complete(self.ctx(number).layout.stage("report"))
        )

    def persist_round(self, number: int) -> None:
        """A finished round's store objects into <results>/rounds/round-N/, for git (never
        over a round already there)."""
        folder = curve_rounds.round_folder(self.results, number)
        if curve_rounds.finished_record(self.results, number).is_file():
            return
        runs = [BASE_RUN, self.run] if number == 0 else [self.run]
        tasks = self.ctx(number).layout.stage("tasks/MANIFEST.json")
        curve_rounds.persist_round(
            self.store, self.results, number, runs, self.settings(number), tasks
        )
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        print(
            f"[curve] round {number}: {size / 1e6:.1f} MB written to {folder} for git",
            file=sys.stderr,
            flush=True,
        )

    def persist_partial(self, number: int) -> None:
        """What the store holds so far of unfinished round `number`, into
        <results>/rounds/round-N-partial/ for git."""
        runs = [BASE_RUN, self.run] if number == 0 and self.run != BASE_RUN else [self.run]
        tasks = self.ctx(number).layout.stage("tasks/MANIFEST.json")
        entry = curve_rounds.persist_partial(
            self.store,
            self.results,
            number,
            runs,
            self.settings(number),
            tasks,
            with_checkpoint=self.args.with_checkpoint,
        )
        folder = curve_rounds.partial_folder(self.results, number)
        size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
        print(
            f"[curve] round {number} (unfinished): {len(entry['keys'])} objects, "
            f"{size / 1e6:.1f} MB written to {folder} for git",
            file=sys.stderr,
            flush=True,
        )

    def round_rule(self, round_number: int, config: Any) -> Any:
        """`config` under the promotion rule, the replay and the likelihood term of round
        `round_number` (round_settings)."""
        settings = round_settings(self.args, round_number)
        samples = settings["promotion"]["samples"]
        if config.promotion.samples != samples:
            promotion = config.promotion.model_copy(update={"samples": samples})
            config = config.model_copy(update={"promotion": promotion})
        train = {key: settings["train"].get(key, off) for key, off in ROUND_TRAIN_KEYS.items()}
        if any(getattr(config.train, key) != value for key, value in train.items()):
            config = config.model_copy(update={"train": config.train.model_copy(update=train)})
        return config

    def settings(self, number: int) -> dict[str, Any]:
        return portable_settings(self.args, number)

    def test_modes(self, name: str, policy: Any, modes: list[str]) -> None:
        """`modes` for one policy on the test split, saved to <name>-test.json. The modes that
        file already holds for this policy (the lineage id) are kept, on any machine: only the
        missing ones are evaluated, one at a time, each added to it as soon as it finishes."""
        from codeq.evaluate import EvalResults, evaluate
        from codeq.pipeline.policies import load_policy

        target = self.results / f"{name}-test.json"
        recorded = EvalResults.load(target) if target.is_file() else None
        if recorded is not None and recorded.policy != policy:
            recorded = None  # another policy under this name (a retrained adapter): redo all
        missing = [mode for mode in modes if recorded is None or mode not in recorded.modes]
        ctx = self.ctx(0)
        tasks_dir = self.args.out / "work" / "tasks-test"

        def work() -> None:
            self.store.get_dir(ctx.layout.stage("tasks"), tasks_dir)
            limit: dict[str, Any] = {}
            if self.args.test_after_chain:  # the test tasks no decision has seen, all of them
                test_file = tasks_dir / "test.jsonl"
                kept = test_file.read_text().splitlines(keepends=True)[self.args.test_skip :]
                test_file.write_text("".join(kept))
                limit = {"max_tasks": None}
            engine = load_policy(ctx, policy)
            merged = recorded
            for modes in batches_of(missing):  # saved after each: a curve cut short keeps them
                evaluation = self.config.evaluate.model_copy(update={"modes": modes, **limit})
                results = evaluate(
                    tasks_dir,
                    self.args.out / "eval" / name,
                    self.config.model_copy(update={"evaluate": evaluation}),
                    split="test",
                    engine=engine,
                    policy=policy,
                )
                merged = results if merged is None else merged.with_modes_of(results)
                merged.save(target)

        counted = self.counted_modes.setdefault(name, set())
        weight = sum(MODE_WEIGHTS[mode] for mode in modes if mode not in counted)
        counted.update(modes)
        described = "+".join(missing or modes)
        self.part(f"test {described} of {name}", weight, not missing, work)

    def choose_learning_rate(self) -> str:
        """Round 0 once per learning rate, each as its own run that shares round 0's tasks,
        trajectories and pairs (copied in the store) and trains, evaluates, promotes and
        reports for real. The run whose candidate solves the most validation tasks carries
        the curve on (ties: the smaller rate). Returns that run's name.

        A choice already recorded in the results (learning-rate.json, committed with them) for
        the same rates is kept: on another machine only the chosen run trains again."""
        rates = [float(rate) for rate in self.args.learning_rates.split(",")]
        target = self.results / "learning-rate.json"
        recorded = read_json_or(target, None)
        if recorded and sorted(t["learning_rate"] for t in recorded["trials"]) == sorted(rates):
            chosen = next(t for t in recorded["trials"] if t["run"] == recorded["chosen_run"])
            print(
                f"[curve] learning rate {chosen['learning_rate']:g}: chosen earlier "
                f"({target.name}); only its run trains",
                file=sys.stderr,
                flush=True,
            )
            self.train_trial(chosen["learning_rate"])
            return str(recorded["chosen_run"])
        trials = [self.trial(rate) for rate in rates]
        best = max(trials, key=lambda trial: (trial["validation_solved"], -trial["learning_rate"]))
        write_result(target, {"chosen_run": best["run"], "trials": trials})
        return str(best["run"])

    def trial(self, rate: float) -> dict[str, Any]:
        """Round 0 with one learning rate, and what validation made of it."""
        return self.trial_summary(self.train_trial(rate), rate)

    def train_trial(self, rate: float) -> str:
        """Round 0 trained, evaluated, promoted and reported with one learning rate: its run."""
        run = f"{BASE_RUN}-lr{rate:g}"
        self.copy_round_inputs(run)
        config = self.config.model_copy(
            update={"train": self.config.train.model_copy(update={"learning_rate": rate})}
        )
        for stage in TRIAL_STAGES:
            self.stage(0, stage, run=run, config=config)
        return run

    def choose_pairs_alpha(self) -> None:
        """pairs.alpha for every round, read off round 0's own train trajectories (never the
        test split): test rewards alone (1.0) when the critique ranks passing rewrites above
        failing ones at about chance, else the configured blend."""
        from codeq.pairs import CRITIQUE_SIGNAL_AUC, critique_signal, read_trajectories
        from codeq.store import RoundLayout

        target = self.results / "pairs-alpha.json"
        if not target.is_file():
            folder = self.args.out / "work" / "alpha-trajectories"
            self.store.get_dir(RoundLayout(BASE_RUN, 0).stage("trajectories/shard-0"), folder)
            signal = critique_signal(read_trajectories([folder]))
            alpha = 1.0 if signal.carries_signal is False else self.config.pairs.alpha
            choice = {
                "alpha": alpha,
                "critique_auc": signal.auc,
                "passing_rewrites": signal.passing,
                "failing_rewrites": signal.failing,
                "rule": f"1.0 when the critique AUC on round 0's train rewrites is below "
                f"{CRITIQUE_SIGNAL_AUC}, else {self.config.pairs.alpha}",
            }
            write_result(target, choice)
            print(f"[curve] pairs.alpha {alpha}: {signal.describe()}", file=sys.stderr, flush=True)
        alpha = float(json.loads(target.read_text())["alpha"])
        self.config = self.config.model_copy(
            update={"pairs": self.config.pairs.model_copy(update={"alpha": alpha})}
        )

    def unpromoted_candidate(self, round_number: int) -> Any:
        """The adapter a round trained but did not promote (None when it promoted or trained
        nothing): its effect on the test split is worth reporting even when validation kept
        it out."""
        from codeq.promotion import PromotionDecision

        prefix = self.ctx(round_number).layout.stage("promote")
        decision = PromotionDecision.model_validate(self.store.get_json(prefix + "/decision.json"))
        return None if decision.promote else decision.candidate

    def record_round(self, number: int, tested: str | None, candidate: str | None) -> None:
        """round-N.json in the results: what the round did (pairs, training, the decision on
        validation) and the names of its test evaluations, read from the store while it is here."""
        layout = self.ctx(number).layout
        decision = self.store.get_json(layout.stage("promote") + "/decision.json")
        train = self.store.get_json(layout.stage("adapter") + "/metrics.json")
        pairs = self.store.get_json(layout.stage("pairs") + "/stats.json")
        entry = {
            "round": number,
            "run": layout.run,
            "pairs": pairs.get("pairs"),
            "critique_auc": pairs.get("critique_auc"),
            "learning_rate": (train.get("config") or {}).get("learning_rate"),
            "global_steps": train.get("global_steps"),
            "heldout_reward_accuracy_final": train.get("heldout_reward_accuracy_final"),
            "promoted": decision["promote"],
            "reason": decision["reason"],
            "validation": decision.get("comparisons", []),
            "incumbent": decision.get("incumbent"),
            "candidate": decision.get("candidate"),
            "test_policy": tested,
            "test_candidate": candidate,
        }
        target = self.results / f"round-{number}.json"
        report_reproduction(number, read_json_or(target, {}).get("candidate"), entry["candidate"])
        write_result(target, entry)

    def copy_round_inputs(self, run: str) -> None:
        """Round 0's tasks, trajectories and pairs of the base run, copied into `run`."""
        sources = dict.fromkeys(("tasks", "trajectories/shard-0", "pairs"), BASE_RUN)
        copy_round_0(self.store, self.args.out / "work" / "copies", sources, run)

    def trial_summary(self, run: str, rate: float) -> dict[str, Any]:
        from codeq.evaluate.results import EvalResults
        from codeq.store import RoundLayout

        layout = RoundLayout(run, 0)
        folder = self.args.out / "work" / "trials" / run
        self.store.get_dir(layout.stage("eval"), folder)
        metrics = self.store.get_json(layout.stage("adapter") + "/metrics.json")
        validation = {
            role: EvalResults.load(folder / role / "validation").primary()
            for role in ("candidate", "incumbent")
        }
        return {
            "run": run,
            "learning_rate": rate,
            "validation_solved": validation["candidate"].solved,
            "validation_incumbent_solved": validation["incumbent"].solved,
            "validation_tasks": validation["candidate"].n,
            "heldout_reward_accuracy_final": metrics.get("heldout_reward_accuracy_final"),
            "global_steps": metrics.get("global_steps"),
            "pairs": metrics.get("pairs"),
            "promoted": self.store.marker(layout.stage("promote")).get("promote"),
        }


WEIGHTS = {
    "prepare": 0.3,
    "collect": 3.0,
    "pairs": 0.05,
    "train": 3.0,
    "evaluate": 1.5,
    "promote": 0.05,
    "report": 0.05,
    "validation": 0.4,
}
# One policy's test modes in the same units (collect's 3.0 took 20 min), as round 0's policy took
# them alone: zero_shot and full_rewrite 3 min each, best-of-16 29 min, MCTS with 8 rollouts 30 min.
MODE_WEIGHTS = {"zero_shot": 0.5, "full_rewrite": 0.5, "bon": 4.5, "mcts": 4.5}
ROUND_STAGES = ["prepare", "collect", "pairs", "train", "evaluate", "promote", "report"]
TRIAL_STAGES = ("train", "evaluate", "promote", "report")  # what each learning-rate trial reruns


# where a stage's output lives in its round (its completion marker's prefix)
STAGE_OUTPUTS = {
    "prepare": "tasks",
    "collect": "trajectories/shard-0",
    "train": "adapter",
    "evaluate": "eval",
}


def copy_round_0(store: Any, work: Path, sources: dict[str, str], run: str) -> None:
    """Round-0 store stages of other runs (stage output -> its run) into `run`'s round 0 as
    they are, markers included; one already complete there is kept."""
    from codeq.store import RoundLayout

    target = RoundLayout(run, 0)
    for name, source_run in sources.items():
        source = RoundLayout(source_run, 0).stage(name)
        if store.is_complete(target.stage(name)):
            continue
        folder = work / run / name
        store.get_dir(source, folder)
        store.put_dir(target.stage(name), folder)
        store.mark_complete(target.stage(name), store.marker(source))


def batches_of(modes: list[str]) -> list[list[str]]:
    """One evaluation a mode, saved after each, but the single-pass modes in one: under the
    plain first turn full_rewrite asks what zero_shot asks, and one evaluation then reuses
    zero_shot's answers instead of writing them again (codeq.evaluate)."""
    single = [mode for mode in modes if mode in SINGLE_PASS_MODES]
    return ([single] if single else []) + [[mode] for mode in modes if mode not in single]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from codeq.errors import ConfigError
    from codeq.pipeline.policies import current_policy

    beyond = [number for number in args.search_candidates if not 0 <= number < args.rounds]
    if beyond:
        raise ConfigError(
            f"--search-candidates {' '.join(map(str, beyond))}: this curve has rounds "
            f"0-{args.rounds - 1}",
            hint="name rounds the curve trains, or raise --rounds",
        )
    curve = Curve(args)
    curve.restore_rounds()
    rates = len(args.learning_rates.split(","))
    round_weight = sum(WEIGHTS[stage] for stage in ROUND_STAGES)
    trial_weight = sum(WEIGHTS[stage] for stage in TRIAL_STAGES)
    curve.total_weight = (
        sum(MODE_WEIGHTS.values()) * (args.rounds + 1)  # at most one promoted policy a round
        + args.rounds * round_weight
        + (rates - 1) * trial_weight
        + (MODE_WEIGHTS["bon"] + MODE_WEIGHTS["mcts"]) * len(args.search_candidates)
    )
    evaluated: dict[str, Any] = {}  # lineage id -> (name, policy), in the order promoted
    kept_out: dict[int, Any] = {}  # round -> (name, candidate) validation did not promote
    promotions_in_a_row = 0
    for number in range(args.rounds):
        if number == 0:  # 1. the base model's tasks, test modes, trajectories and pairs
            for stage in ("prepare", "collect", "pairs"):
                if stage == "collect":
                    base = current_policy(curve.ctx(0))
                    if not args.test_after_chain:
                        curve.test_modes("base", base, SINGLE_PASS_MODES + ["mcts"])
                    evaluated[base.id] = ("base", base)
                if stage == "pairs":
                    curve.choose_pairs_alpha()
                curve.stage(0, stage)
            # 2. round 0 trained once per learning rate; validation picks the run to go on with
            curve.run = curve.choose_learning_rate()
            chosen = json.loads((args.results / "learning-rate.json").read_text())["trials"]
            rate = next(t["learning_rate"] for t in chosen if t["run"] == curve.run)
            curve.config = curve.config.model_copy(
                update={"train": curve.config.train.model_copy(update={"learning_rate": rate})}
            )
        else:  # 3. later rounds chain from what the run promoted so far
            for stage in ROUND_STAGES:
                if stage == "prepare" and curve.restored_finished(number):
                    continue  # every stage after it is done: its tasks are read by none
                curve.stage(number, stage)
        promoted = current_policy(curve.ctx(number + 1))  # what rounds <= number promoted
        tested, candidate_tested = None, None
        if promoted.id not in evaluated:  # 4. every promoted policy, single pass, on test
            tested = f"round-{number}"
            if not args.test_after_chain:
                curve.test_modes(tested, promoted, SINGLE_PASS_MODES)
            evaluated[promoted.id] = (tested, promoted)
        else:  # a candidate validation kept out is measured too: reported, never used
            candidate = curve.unpromoted_candidate(number)
            if candidate is not None:
                candidate_tested = f"round-{number}-candidate"
                if not args.test_after_chain:
                    curve.test_modes(candidate_tested, candidate, SINGLE_PASS_MODES)
                kept_out[number] = (candidate_tested, candidate)
        curve.record_round(number, tested, candidate_tested)
        curve.persist_round(number)  # 5. what a fresh machine needs to go on, for git
        if not args.test_after_chain:
            write_summary(args)  # 6. the curve so far, from the result files alone
        if number in args.search_candidates and number not in kept_out:  # known now, not hours on
            raise ConfigError(
                f"--search-candidates {number}: round {number} has no candidate that "
                "validation kept out in this curve",
                hint=f"name rounds whose round-N.json says promoted: false (of 0-{args.rounds - 1})",
            )
        promotions_in_a_row = promotions_in_a_row + 1 if tested is not None else 0
        ending = chain_end(number, promotions_in_a_row, args.rounds, args.stop_after_promotions)
        if ending:
            print(f"[curve] {ending}", flush=True)
            break
    if args.test_after_chain:  # 7. once: every promoted policy single pass (the claim) first,
        for name, policy in evaluated.values():  # then the kept-out candidates'
            curve.test_modes(name, policy, SINGLE_PASS_MODES)
        for name, candidate in kept_out.values():
            curve.test_modes(name, candidate, SINGLE_PASS_MODES)
        print(f"[curve] {SEARCH_MODES_WAIT}", flush=True)
    else:
        for name, policy in evaluated.values():  # 7. every mode, search included
            curve.test_modes(name, policy, TEST_MODES)
    for number in args.search_candidates:  # 8. and of the kept-out candidates asked for
        if number not in kept_out:  # the chain ended before that round
            print(f"[curve] --search-candidates {number}: the chain ended before it", flush=True)
            continue
        curve.test_modes(*kept_out[number], TEST_MODES)
    summary = write_summary(args)
    print(table(summary))
    return summary


def chain_end(number: int, promotions_in_a_row: int, rounds: int, wanted: int) -> str | None:
    """Why the chain ends after round `number` under --stop-after-promotions `wanted`: that
    many rounds promoted in a row, or too few rounds left to make them; None: it goes on."""
    rounds_left = rounds - 1 - number
    if not wanted:
        return None
    if promotions_in_a_row >= wanted:
        return (
            f"rounds {number - promotions_in_a_row + 1}-{number} promoted in a row: the chain "
            "ends here (--stop-after-promotions)"
        )
    if rounds_left and promotions_in_a_row + rounds_left < wanted:
        return (
            f"round {number}: {promotions_in_a_row} promoted in a row and {rounds_left} "
            f"round{'s' if rounds_left > 1 else ''} left cannot make {wanted} in a row: the chain "
            "ends here (--stop-after-promotions; raise --rounds to go on)"
        )
    return None


def persist_finished_rounds(args: argparse.Namespace) -> None:
    """Every round of the chosen run whose promotion decision the store holds, into
    <results>/rounds/ (a round already there is left as it is)."""
    from codeq.errors import MissingInputError

    recorded = read_json_or(args.results / "learning-rate.json", None)
    if recorded is None:
        raise MissingInputError(
            f"no learning rate chosen yet in {args.results / 'learning-rate.json'}",
            hint="a curve persists its rounds once round 0 has chosen its run",
        )
    curve = Curve(args)
    curve.run = str(recorded["chosen_run"])
    for number in range(args.rounds):
        if curve.store.is_complete(curve.ctx(number).layout.stage("promote")):
            curve.persist_round(number)


def restore_committed_rounds(args: argparse.Namespace) -> None:
    """The committed rounds into the store, each with its tasks prepared again (the data set is
    never in git) and checked against the sha256 in git, or with `--restore-tasks held-out`
    round 0's alone; the curve's own loop prepares only round 0 and the rounds it computes. No
    round goes further."""
    from codeq.errors import MissingInputError

    numbers = curve_rounds.committed_rounds(args.results)
    if not numbers:
        raise MissingInputError(
            f"no round committed under {args.results / 'rounds'}",
            hint="--restore-only restores what a curve persisted; run the curve itself to begin one",
        )
    curve = Curve(args)
    curve.restore_rounds()
    curve.stage(0, "prepare")
    recorded = read_json_or(args.results / "learning-rate.json", None)
    if recorded is not None:
        curve.run = str(recorded["chosen_run"])
        curve.copy_round_inputs(curve.run)
    prepared = [n for n in numbers if n > 0] if args.restore_tasks == "every-round" else []
    for number in prepared:
        curve.stage(number, "prepare")
    print(
        f"[curve] rounds {', '.join(map(str, numbers))} restored into {args.out / 'store'} "
        f"(run {curve.run}), with the tasks of rounds {', '.join(map(str, [0, *prepared]))}",
        flush=True,
    )


def persist_partial_round(args: argparse.Namespace) -> None:
    """The first round of the chosen run without a promotion decision, as far as the store
    holds it, into <results>/rounds/round-N-partial/. A curve may run meanwhile (this only
    reads), but not a train: its newer checkpoint deletes the one being copied."""
    from codeq.errors import MissingInputError

    curve = Curve(args)
    recorded = read_json_or(args.results / "learning-rate.json", None)
    curve.run = str(recorded["chosen_run"]) if recorded else BASE_RUN
    for number in range(args.rounds):
        if not curve.store.is_complete(curve.ctx(number).layout.stage("promote")):
            if not curve.store.list(f"runs/{curve.run}/round-{number}/"):
                break
            curve.persist_partial(number)
            return
    raise MissingInputError(
        f"no unfinished round under way in {args.out / 'store'} (of rounds 0-{args.rounds - 1})",
        hint="--persist-partial copies the round a curve is computing; finished rounds are "
        "persisted by the curve itself (or --persist-rounds)",
    )


def check_rates(args: argparse.Namespace) -> None:
    """Round 0 trained with other learning rates after the choice, on the same pairs, each
    judged on validation as the trials were: whether the choice holds, recorded beside it.
    The chosen run, and so every later round, is left as it is."""
    from codeq.errors import MissingInputError

    target = args.results / "learning-rate.json"
    recorded = read_json_or(target, None)
    if recorded is None:
        raise MissingInputError(
            f"no learning rate chosen yet in {target}",
            hint="run the curve first (its round 0 chooses one); --check-rates checks that choice",
        )
    rates = [float(rate) for rate in args.check_rates.split(",")]
    known = {trial["learning_rate"] for trial in recorded["trials"]}
    checked = {trial["learning_rate"]: trial for trial in recorded.get("checked_after_choice", [])}
    todo = [rate for rate in rates if rate not in known and rate not in checked]
    curve = Curve(args)
    curve.total_weight = len(todo) * sum(WEIGHTS[stage] for stage in TRIAL_STAGES)
    curve.choose_pairs_alpha()  # the chosen trial's config but for the rate
    for rate in todo:  # saved after each, so an interrupted check keeps the rates it finished
        checked[rate] = curve.trial(rate)
        recorded["checked_after_choice"] = [checked[key] for key in sorted(checked)]
        write_result(target, recorded)
    for trial in [*recorded["trials"], *recorded.get("checked_after_choice", [])]:
        print(
            f"learning rate {trial['learning_rate']:g}: {trial['validation_solved']} of "
            f"{trial['validation_tasks']} validation tasks (incumbent "
            f"{trial['validation_incumbent_solved']}), promoted {trial['promoted']}"
        )


def portable_settings(args: argparse.Namespace, number: int = 0) -> dict[str, Any]:
    """Round `number`'s settings without what belongs to this machine: the store's location,
    and the folders the model and DebugBench were found in (their file and folder names stay)."""
    settings = {key: value for key, value in round_settings(args, number).items() if key != "store"}
    settings["policy"] = {**settings["policy"], "model": Path(settings["policy"]["model"]).name}
    settings["tasks"] = {**settings["tasks"], "source": Path(settings["tasks"]["source"]).name}
    return settings


def write_summary(args: argparse.Namespace) -> dict[str, Any]:
    summary = summarize(args.results, portable_settings(args))
    if args.promotion_samples:  # the rule later rounds were decided by (round-N.json has each)
        summary["promotion_samples_from"] = {
            "round": args.promotion_samples_from,
            "samples": args.promotion_samples,
        }
    if args.replay_rounds:  # what later rounds trained on (round-N.json's settings have each)
        summary["replay_from"] = {"round": args.replay_from, "earlier_rounds": args.replay_rounds}
    if args.sft_weight:  # the likelihood term later rounds trained with
        summary["sft_from"] = {"round": args.sft_from, "sft_weight": args.sft_weight}
    write_result(args.results / "summary.json", summary)
    return summary


def summarize(results: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Every number of the curve, read from the result files alone (no store, no model), so
    that a clone of the repository holds the curve so far: per policy and mode the solve rate
    with its Wilson interval and the programs written; per finished round (round-N.json) the
    decision and the paired test on the test split (reported, never used to decide) of the
    round's policy against the one before it, or, when validation kept its candidate out, of
    that candidate against the policy it failed to replace."""
    from codeq.evaluate.results import EvalResults
    from codeq.promotion import compare

    numbered = {
        int(match.group(1)): path
        for path in results.glob("round-*.json")
        if (match := re.fullmatch(r"round-(\d+)", path.stem))
    }
    rounds = [json.loads(numbered[number].read_text()) for number in sorted(numbered)]
    evaluated = ["base"] + [entry["test_policy"] for entry in rounds if entry["test_policy"]]
    candidates = [entry["test_candidate"] for entry in rounds if entry["test_candidate"]]
    loaded = {
        name: EvalResults.load(results / f"{name}-test.json") for name in evaluated + candidates
    }
    for entry in rounds:
        name, candidate = entry["test_policy"], entry["test_candidate"]
        if name:
            previous = loaded[evaluated[evaluated.index(name) - 1]]
            entry["test_vs_previous"] = {
                mode: compare(mode, loaded[name], previous).model_dump()
                for mode in SINGLE_PASS_MODES
            }
        elif candidate:
            incumbent = incumbent_name(evaluated, loaded, entry["incumbent"])
            entry["test_candidate_vs_incumbent"] = {
                "incumbent": incumbent,
                **{
                    mode: compare(mode, loaded[candidate], loaded[incumbent]).model_dump()
                    for mode in SINGLE_PASS_MODES
                },
            }
    rewrites = settings["search"]["rewrites_per_expansion"]
    return {
        "settings": settings,
        "pairs_alpha": read_json_or(results / "pairs-alpha.json", None),
        "timings_seconds": read_json_or(results / "timings.json", {}),
        "policies": {name: policy_rows(evaluation) for name, evaluation in loaded.items()},
        "mcts_vs_bon": {
            name: mcts_vs_bon(evaluation, rewrites)
            for name, evaluation in loaded.items()
            if evaluation.mcts_rollout_ablation and evaluation.bon_ablation
        },
        "rounds": rounds,
    }


def mcts_vs_bon(evaluation: Any, rewrites: int) -> list[dict[str, Any]]:
    """MCTS at each budget b against best-of-N with N = K * b, the most programs b rollouts
    can write, paired on the same test tasks (gained and lost by MCTS)."""
    from codeq.promotion import compare_modes

    rows = []
    for budget, mcts in sorted(evaluation.mcts_rollout_ablation.items(), key=lambda i: int(i[0])):
        samples = str(int(budget) * rewrites)
        if samples in evaluation.bon_ablation:
            label = f"mcts@{budget} vs bon@{samples}"
            paired = compare_modes(label, mcts, evaluation.bon_ablation[samples])
            rows.append({**paired.model_dump(), "mcts_programs": mcts.programs})
    return rows


def report_reproduction(number: int, recorded: Any, computed: Any) -> None:
    """On another machine a round is computed again from its inputs: say whether its candidate
    (the adapter's sha256 in its lineage) is the one the results recorded, so that reusing a
    recorded measurement of it is shown to be sound, or that it is not."""
    if not recorded or not computed:
        return
    same = recorded == computed
    print(
        f"[curve] round {number}'s candidate computed again: "
        + ("identical to the recorded one" if same else "differs from the recorded one")
        + f" (adapter sha256 {recorded['adapters'][-1]['sha256'][:12]} recorded, "
        f"{computed['adapters'][-1]['sha256'][:12]} now)",
        file=sys.stderr,
        flush=True,
    )


def read_json_or(path: Path, default: Any) -> Any:
    """A result file's content, or `default` when the curve has not written it yet."""
    return json.loads(path.read_text()) if path.is_file() else default


def write_result(path: Path, data: Any) -> None:
    """A result file, written whole or not at all (an interruption leaves the old one)."""
    from codeq.schemas import write_json

    write_json(path, data, indent=1)


def policy_rows(evaluation: Any) -> dict[str, Any]:
    rows = {mode: evaluation.modes[mode] for mode in evaluation.modes}
    rows.update({f"mcts@{b}": r for b, r in evaluation.mcts_rollout_ablation.items()})
    rows.update({f"bon@{n}": r for n, r in evaluation.bon_ablation.items()})
    return {
        "lineage": evaluation.policy.describe() if evaluation.policy else None,
        "tasks": len(evaluation.task_ids),
        "modes": {
            key: {
                "solved": row.solved,
                "n": row.n,
                "solve_rate": row.solve_rate,
                "ci_low": row.ci_low,
                "ci_high": row.ci_high,
                "programs": row.programs,
                "completion_tokens": row.completion_tokens,
                "seconds": row.seconds,
            }
            for key, row in rows.items()
        },
    }


def incumbent_name(names: list[str], loaded: dict[str, Any], incumbent: dict[str, Any]) -> str:
    """The evaluated policy a round's candidate was compared with on validation."""
    from codeq.schemas import Lineage

    wanted = Lineage.model_validate(incumbent).id
    return next(name for name in names if loaded[name].policy.id == wanted)


def table(summary: dict[str, Any]) -> str:
    names = list(summary["policies"])
    keys = list(next(iter(summary["policies"].values()))["modes"]) if names else []
    lines = ["| mode | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        cells = []
        for name in names:
            row = summary["policies"][name]["modes"].get(key)
            cells.append(
                "–"
                if row is None
                else f"{row['solved']}/{row['n']} ({100 * row['solve_rate']:.1f}%, "
                f"{100 * row['ci_low']:.0f}–{100 * row['ci_high']:.0f}; {row['programs']:.1f} progs)"
            )
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    paired = [(name, row) for name, rows in summary.get("mcts_vs_bon", {}).items() for row in rows]
    if paired:
        lines += [
            "",
            "| policy | MCTS vs best-of-N | solved | MCTS gained / lost | p MCTS better | p worse |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in paired:
            lines.append(
                f"| {name} | {row['mode']} | {row['candidate_solved']} vs "
                f"{row['incumbent_solved']} | +{len(row['gained'])} / -{len(row['lost'])} | "
                f"{row['p_better']:.3f} | {row['p_worse']:.3f} |"
            )
    return "\n".join(lines)


def write_eval_config(args: argparse.Namespace) -> None:
    """The settings every test evaluation of the curve ran with, the model left to --model."""
    import yaml

    settings = curve_settings(args)
    evaluation = {part: settings[part] for part in ("policy", "search", "evaluate")}
    del evaluation["policy"]["model"]
    args.write_eval_config.write_text(yaml.safe_dump(evaluation, sort_keys=False))
    print(f"wrote {args.write_eval_config}")


def sized(args: argparse.Namespace) -> argparse.Namespace:
    """The options as the curve runs them: --tiny is SmolLM2 on builtin tasks, a few of each."""
    if args.tiny:
        args.model = "smollm2"
        args.source = "builtin"
        args.test_tasks, args.validation_tasks, args.train_tasks = 2, 2, 3
        args.rounds = min(args.rounds, 2)
    return args


def main() -> None:
    args = sized(parse_args())
    from codeq.errors import CodeQError
    from codeq.logs import report_error

    try:
        if args.write_eval_config:
            write_eval_config(args)
            return
        if args.summary_only:
            print(table(write_summary(args)))
            return
        if args.check_rates:
            check_rates(args)
            return
        if args.persist_rounds:
            persist_finished_rounds(args)
            return
        if args.persist_partial:
            persist_partial_round(args)
            return
        if args.restore_only:
            restore_committed_rounds(args)
            return
        run(args)
    except CodeQError as exc:  # one error: line and a hint, as the CLI prints them
        sys.exit(report_error(exc, traceback=False))


if __name__ == "__main__":
    main()
