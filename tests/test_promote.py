"""Promotion: the candidate becomes the run's current policy only when it solves significantly
more of the same validation tasks than the incumbent (one-sided exact McNemar) and is not
significantly worse in any promotion mode; the test split never enters the decision."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from codeq.cli import run as cli_run
from codeq.config import PromotionConfig, StoreConfig
from codeq.errors import CorruptInputError
from codeq.evaluate.results import EvalResults, ModeResult, SampledPasses
from codeq.promotion import PromotionDecision, decide, one_sided_mcnemar, sign_flip_p_values
from codeq.schemas import AdapterLink, Lineage
from codeq.store import RoundLayout, open_store

BASE = Lineage(base_model="smollm2", base_sha256="b" * 64)
CANDIDATE = BASE.extended(AdapterLink(round=0, sha256="c" * 64, source="runs/r1/round-0/adapter"))
TASKS = [f"t{i}" for i in range(12)]
REPO = Path(__file__).resolve().parent.parent


def mode_result(solved: set[str], task_ids: list[str]) -> ModeResult:
    per_task = {task: task in solved for task in task_ids}
    count = sum(per_task.values())
    return ModeResult(
        n=len(task_ids),
        solved=count,
        solve_rate=count / len(task_ids),
        ci_low=0.0,
        ci_high=1.0,
        per_task=per_task,
    )


def results(
    split: str, policy: Lineage, task_ids: list[str] = TASKS, **solved_by_mode: set[str]
) -> EvalResults:
    return EvalResults(
        model="smollm2",
        policy=policy,
        split=split,  # type: ignore[arg-type]
        task_ids=task_ids,
        primary_mode=next(iter(solved_by_mode)),
        confidence=0.95,
        modes={mode: mode_result(solved, task_ids) for mode, solved in solved_by_mode.items()},
    )


def test_exact_mcnemar_p_values() -> None:
    assert one_sided_mcnemar(0, 0) == 1.0
    assert one_sided_mcnemar(5, 0) == pytest.approx(1 / 32)
    assert one_sided_mcnemar(6, 1) == pytest.approx(8 / 128)
    assert one_sided_mcnemar(1, 6) == pytest.approx(127 / 128)
    assert one_sided_mcnemar(3, 3) == pytest.approx(42 / 64)


def test_equal_policies_are_rarely_promoted() -> None:
    """Two policies with the same per-task solve probabilities, evaluated independently: the
    gate promotes in about `level` of rounds (the old "strictly more solved" rule: ~45%)."""
    config = PromotionConfig(level=0.05)
    task_ids = [f"t{i}" for i in range(60)]
    promoted = strictly_more = 0
    trials = 400
    for seed in range(trials):
        rng = random.Random(seed)
        difficulty = {task: rng.random() for task in task_ids}
        outcomes = [
            {task for task in task_ids if rng.random() < difficulty[task]} for _ in range(2)
        ]
        candidate = results("validation", CANDIDATE, task_ids, full_rewrite=outcomes[0])
        incumbent = results("validation", BASE, task_ids, full_rewrite=outcomes[1])
        promoted += decide(0, candidate, incumbent, config).promote
        strictly_more += len(outcomes[0]) > len(outcomes[1])
    assert promoted / trials <= 0.06
    assert strictly_more / trials > 0.35


def test_a_clearly_better_candidate_is_promoted() -> None:
    candidate = results("validation", CANDIDATE, full_rewrite=set(TASKS[:9]))
    incumbent = results("validation", BASE, full_rewrite=set(TASKS[:2]))
    decision = decide(3, candidate, incumbent, PromotionConfig())
    assert decision.promote
    assert decision.round == 3 and decision.gate_mode == "full_rewrite"
    assert decision.comparisons[0].gained == sorted(TASKS[2:9])
    assert decision.comparisons[0].p_better == pytest.approx(1 / 128)
    assert decision.candidate == CANDIDATE and decision.incumbent == BASE
    assert decision.reason.startswith("PROMOTED: on 12 validation tasks (full_rewrite)")


def test_a_significant_regression_in_another_mode_blocks_promotion() -> None:
    config = PromotionConfig(modes=["full_rewrite", "mcts"])
    candidate = results("validation", CANDIDATE, full_rewrite=set(TASKS[:9]), mcts=set(TASKS[:1]))
    incumbent = results("validation", BASE, full_rewrite=set(TASKS[:2]), mcts=set(TASKS[:8]))
    decision = decide(0, candidate, incumbent, config)
    assert not decision.promote
    assert "significantly worse in mcts" in decision.reason


def test_the_decision_refuses_test_split_results() -> None:
    candidate = results("test", CANDIDATE, full_rewrite=set(TASKS))
    incumbent = results("test", BASE, full_rewrite=set())
    with pytest.raises(ValueError, match="validation split, not test"):
        decide(0, candidate, incumbent, PromotionConfig())


# ------------------------------------------------------------------ the promote stage


def put_round(store, layout, tmp_path, evaluations: dict[str, EvalResults], trained=True):
    """An adapter marker and a complete eval stage holding `evaluations` by role/split."""
    adapter_dir = tmp_path / f"adapter-{layout.round}"
    adapter_dir.mkdir()
    (adapter_dir / "metrics.json").write_text(json.dumps({"trained": trained}))
    store.put_dir(layout.stage("adapter"), adapter_dir)
    store.mark_complete(layout.stage("adapter"), {"trained": trained})
    eval_dir = tmp_path / f"eval-{layout.round}"
    for where, evaluation in evaluations.items():
        evaluation.save(eval_dir / where / "results.json")
    (eval_dir / "summary.json").write_text("{}")
    store.put_dir(layout.stage("eval"), eval_dir)
    store.mark_complete(layout.stage("eval"))


def promote(store_root, round_number: int, capsys) -> tuple[int, str]:
    code = cli_run(
        ["promote", "--store", f"file://{store_root}", "--run", "r1", "--round", str(round_number)]
    )
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def store_root(tmp_path):
    return tmp_path / "store"


def test_promotion_follows_validation_and_ignores_the_test_split(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    round0 = RoundLayout("r1", 0)
    put_round(
        store,
        round0,
        tmp_path,
        {
            # validation: a clear gain; test: a clear loss (reported, never decides)
            "candidate/validation": results("validation", CANDIDATE, full_rewrite=set(TASKS[:9])),
            "incumbent/validation": results("validation", BASE, full_rewrite=set(TASKS[:2])),
            "candidate/test": results("test", CANDIDATE, full_rewrite=set()),
            "incumbent/test": results("test", BASE, full_rewrite=set(TASKS)),
        },
    )
    code, output = promote(store_root, 0, capsys)
    assert code == 0, output
    assert "PROMOTED" in output
    current = store.get_json(round0.current + "/CURRENT.json")
    assert current["round"] == 0
    assert Lineage.model_validate(current["policy"]) == CANDIDATE

    round1 = RoundLayout("r1", 1)
    later = CANDIDATE.extended(AdapterLink(round=1, sha256="d" * 64, source="x"))
    put_round(
        store,
        round1,
        tmp_path,
        {
            # validation: a tie; test: a clear gain (which must not promote)
            "candidate/validation": results("validation", later, full_rewrite=set(TASKS[:5])),
            "incumbent/validation": results("validation", CANDIDATE, full_rewrite=set(TASKS[:5])),
            "candidate/test": results("test", later, full_rewrite=set(TASKS)),
            "incumbent/test": results("test", CANDIDATE, full_rewrite=set()),
        },
    )
    code, output = promote(store_root, 1, capsys)
    assert code == 0, output
    assert "kept the incumbent" in output
    decision = store.get_json(round1.stage("promote") + "/decision.json")
    assert decision["promote"] is False and decision["split"] == "validation"
    assert Lineage.model_validate(store.get_json(round0.current + "/CURRENT.json")["policy"]) == (
        CANDIDATE
    )
    # promote is idempotent: a rerun of a decided round skips and changes nothing
    assert promote(store_root, 1, capsys)[0] == 0
    assert store.get_json(round0.current + "/CURRENT.json")["round"] == 0


def test_round_without_adapter_keeps_the_incumbent(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    layout = RoundLayout("r1", 0)
    put_round(
        store,
        layout,
        tmp_path,
        {"incumbent/test": results("test", BASE, full_rewrite={"t1"})},
        trained=False,
    )
    code, output = promote(store_root, 0, capsys)
    assert code == 0
    assert "no adapter was trained" in output
    assert store.is_complete(layout.stage("promote"))
    assert not store.exists(layout.current + "/CURRENT.json")


def test_different_task_ids_are_refused_without_marker(store_root, tmp_path, capsys):
    store = open_store(StoreConfig(uri=f"file://{store_root}"))
    layout = RoundLayout("r1", 0)
    other_tasks = [*TASKS[:-1], "t99"]
    put_round(
        store,
        layout,
        tmp_path,
        {
            "candidate/validation": results("validation", CANDIDATE, full_rewrite={"t1"}),
            "incumbent/validation": results("validation", BASE, other_tasks, full_rewrite={"t1"}),
        },
    )
    code, output = promote(store_root, 0, capsys)
    assert code == 2
    assert [line for line in output.splitlines() if line.startswith("error:")] == [
        "error: the candidate and the incumbent were evaluated on different validation tasks"
    ]
    assert not store.is_complete(layout.stage("promote"))


def test_promote_without_evaluation_is_missing_input(store_root, capsys):
    code, output = promote(store_root, 0, capsys)
    assert code == 2
    assert "evaluation is not complete" in output


# ------------------------------------------------------------------ sampled answers, guard modes


def sampled_results(
    split: str, policy: Lineage, greedy: dict[str, bool], passes: dict[str, int], samples: int
) -> EvalResults:
    """Full_rewrite results whose tasks also hold `passes` of `samples` sampled answers."""
    task_ids = list(greedy)
    evaluation = results(split, policy, task_ids, full_rewrite={t for t in task_ids if greedy[t]})
    evaluation.modes["full_rewrite"].sampled = SampledPasses(
        samples=samples,
        temperature=0.8,
        top_p=0.95,
        per_task=passes,
        pass_rate=sum(passes.values()) / (samples * len(task_ids)),
    )
    return evaluation


def brute_force_p_values(differences: list[int]) -> tuple[float, float]:
    """The sign-flip p-values by listing every assignment of signs to the nonzero differences."""
    sizes = [abs(d) for d in differences if d]
    observed = sum(differences)
    sums = [
        sum(sign * size for sign, size in zip(signs, sizes, strict=True))
        for signs in itertools.product((1, -1), repeat=len(sizes))
    ]
    return (
        sum(total >= observed for total in sums) / len(sums),
        sum(total <= observed for total in sums) / len(sums),
    )


def test_the_sign_flip_test_counts_every_sign_assignment_exactly() -> None:
    rng = random.Random(3)
    for _ in range(60):
        differences = [rng.randint(-5, 5) for _ in range(rng.randint(0, 12))]
        assert sign_flip_p_values(differences) == pytest.approx(
            brute_force_p_values(differences), abs=1e-12
        )
    # one greedy answer per task: the sign-flip test is the exact McNemar test
    for gained in range(9):
        for lost in range(9):
            differences = [1] * gained + [-1] * lost + [0] * 4
            assert sign_flip_p_values(differences) == pytest.approx(
                (one_sided_mcnemar(gained, lost), one_sided_mcnemar(lost, gained)), abs=1e-15
            )
    # direction: gains make p_better small, the mirror image makes p_worse small
    assert sign_flip_p_values([3, 2, 4, 1, 5, 2]) == pytest.approx((1 / 64, 1.0))
    assert sign_flip_p_values([-3, -2, -4, -1, -5, -2]) == pytest.approx((1.0, 1 / 64))
    # the sum decides, not the count of tasks: one large loss outweighs five small gains
    assert sign_flip_p_values([1, 1, 1, 1, 1, -9]) == pytest.approx((33 / 64, 32 / 64))
    assert one_sided_mcnemar(5, 1) < 0.11  # counting tasks alone would call it a gain


@pytest.mark.parametrize("sizes", [[1, 1, 2, 3, 5, 8, 1, 2, 4], [3] * 10, [1, 2, 3, 4, 5, 6, 7]])
def test_the_sign_flip_test_holds_its_level(sizes: list[int]) -> None:
    """When neither policy is better, every sign assignment is equally likely: the fraction of
    them the test calls significant is at most the level, at every level."""
    for level in (0.01, 0.05, 0.1, 0.25):
        significant = sum(
            sign_flip_p_values([s * size for s, size in zip(signs, sizes, strict=True)])[0] < level
            for signs in itertools.product((1, -1), repeat=len(sizes))
        )
        assert significant / 2 ** len(sizes) <= level


def test_sampled_answers_promote_a_gain_the_greedy_answers_cannot_show() -> None:
    """Greedy: +3 / -1 of 40 (McNemar p = 0.31). The 8 sampled answers a task show the
    candidate better on 12 tasks and worse on none: promoted with samples, not without."""
    task_ids = [f"t{i}" for i in range(40)]
    greedy_new = {t: i in (0, 1, 2, 5, 6) for i, t in enumerate(task_ids)}
    greedy_old = {t: i in (3, 5, 6) for i, t in enumerate(task_ids)}
    new_passes = {t: (4 if i < 12 else 0) for i, t in enumerate(task_ids)}
    old_passes = {t: (1 if i < 12 else 0) for i, t in enumerate(task_ids)}
    candidate = sampled_results("validation", CANDIDATE, greedy_new, new_passes, 8)
    incumbent = sampled_results("validation", BASE, greedy_old, old_passes, 8)

    greedy_only = decide(0, candidate, incumbent, PromotionConfig())
    assert not greedy_only.promote
    assert greedy_only.comparisons[0].p_better == pytest.approx(one_sided_mcnemar(3, 1))

    decision = decide(0, candidate, incumbent, PromotionConfig(samples=8))
    assert decision.promote and decision.samples == 8
    gate = decision.comparisons[0]
    assert gate.test == "sign_flip" and gate.pass_counts is not None
    assert (gate.pass_counts.candidate_passes, gate.pass_counts.incumbent_passes) == (53, 15)
    assert (gate.pass_counts.tasks_better, gate.pass_counts.tasks_worse) == (12, 0)
    differences = [
        int(greedy_new[t]) + new_passes[t] - int(greedy_old[t]) - old_passes[t] for t in task_ids
    ]
    assert gate.p_better == pytest.approx(sign_flip_p_values(differences)[0])
    assert gate.p_better < 0.001
    assert "8 sampled answers per task" in decision.reason
    assert "one-sided exact sign-flip p" in decision.reason


def test_sampled_answers_do_not_promote_an_equal_candidate() -> None:
    """Equal per-task solve probabilities for both policies, greedy + 4 sampled answers each:
    promoted in about `level` of rounds at most."""
    config = PromotionConfig(samples=4, level=0.05)
    task_ids = [f"t{i}" for i in range(40)]
    promoted = 0
    trials = 300
    for seed in range(trials):
        rng = random.Random(seed)
        difficulty = {task: rng.random() ** 3 for task in task_ids}
        evaluations = []
        for policy in (CANDIDATE, BASE):
            greedy = {task: rng.random() < difficulty[task] for task in task_ids}
            passes = {
                task: sum(rng.random() < difficulty[task] for _ in range(4)) for task in task_ids
            }
            evaluations.append(sampled_results("validation", policy, greedy, passes, 4))
        promoted += decide(0, evaluations[0], evaluations[1], config).promote
    assert promoted / trials <= 0.06


def sharpened(task_ids: list[str]) -> tuple[EvalResults, EvalResults]:
    """A candidate that passes many more of its 9 answers on the 20 tasks both reach (8 of 9
    against 2) but no answer at all on 12 tasks the incumbent reaches (1 of 9 there): more
    passes, fewer tasks reached."""
    greedy = dict.fromkeys(task_ids, False)
    new_passes = {t: (8 if i < 20 else 0) for i, t in enumerate(task_ids)}
    old_passes = {t: (2 if i < 20 else 1 if i < 32 else 0) for i, t in enumerate(task_ids)}
    return (
        sampled_results("validation", CANDIDATE, greedy, new_passes, 8),
        sampled_results("validation", BASE, greedy, old_passes, 8),
    )


def test_reach_is_reported_and_its_guard_blocks_a_candidate_that_reaches_fewer_tasks() -> None:
    candidate, incumbent = sharpened([f"t{i}" for i in range(60)])
    reported = decide(0, candidate, incumbent, PromotionConfig(samples=8))
    assert reported.promote  # the pass counts alone: 160 against 52
    reach = reported.comparisons[0].pass_counts.reach
    assert (reach.candidate, reach.incumbent, reach.gained, reach.lost) == (20, 32, 0, 12)
    assert reach.p_worse == pytest.approx(one_sided_mcnemar(12, 0))
    assert "some answer passes on 20 tasks vs 32 (+0 / -12" in reported.reason
    guarded = decide(0, candidate, incumbent, PromotionConfig(samples=8, reach_guard=True))
    assert not guarded.promote
    assert guarded.reason.startswith("kept the incumbent")
    assert guarded.reason.endswith("blocked by promotion.reach_guard")
    # the same candidate reaching what the incumbent reaches is promoted under the guard
    widened = candidate.model_copy(deep=True)
    widened.modes["full_rewrite"].sampled.per_task.update({f"t{i}": 1 for i in range(20, 32)})
    assert decide(0, widened, incumbent, PromotionConfig(samples=8, reach_guard=True)).promote


def test_the_reach_guard_needs_sampled_answers() -> None:
    with pytest.raises(ValidationError, match="reach_guard reads the k sampled answers"):
        PromotionConfig(reach_guard=True)
    assert PromotionConfig(samples=8, reach_guard=True).reach_guard


def test_promotion_with_samples_refuses_evaluations_without_them() -> None:
    greedy = {t: t in TASKS[:6] for t in TASKS}
    four = sampled_results("validation", CANDIDATE, greedy, dict.fromkeys(TASKS, 3), 4)
    two = sampled_results("validation", BASE, greedy, dict.fromkeys(TASKS, 1), 2)
    plain = results("validation", BASE, full_rewrite=set(TASKS[:1]))
    for incumbent, held in ((plain, "none"), (two, "2 per task")):
        with pytest.raises(
            CorruptInputError, match=f"incumbent's .* holds no 4 sampled .*it holds {held}"
        ):
            decide(0, four, incumbent, PromotionConfig(samples=4))
    assert decide(0, four, plain, PromotionConfig()).comparisons[0].test == "mcnemar"


def test_samples_need_a_single_answer_gate_mode() -> None:
    with pytest.raises(ValidationError, match="single-answer first promotion mode"):
        PromotionConfig(modes=["mcts", "full_rewrite"], samples=4)
    assert PromotionConfig(modes=["zero_shot"], samples=4).samples == 4


def test_a_guard_mode_catches_a_loss_in_a_mode_not_trained_on() -> None:
    """The candidate gains clearly in full_rewrite (7 of 12 tasks, none lost) but loses 6 of
    the 7 tasks zero_shot solved: the guard mode blocks; without it the loss goes unchecked."""
    candidate = results(
        "validation", CANDIDATE, full_rewrite=set(TASKS[:9]), zero_shot=set(TASKS[:1])
    )
    incumbent = results("validation", BASE, full_rewrite=set(TASKS[:2]), zero_shot=set(TASKS[:7]))
    unguarded = decide(0, candidate, incumbent, PromotionConfig(guard_modes=[]))
    assert unguarded.promote
    assert [c.mode for c in unguarded.comparisons] == ["full_rewrite"]

    guarded = decide(0, candidate, incumbent, PromotionConfig(guard_modes=["zero_shot"]))
    assert not guarded.promote
    assert guarded.guard_modes == ["zero_shot"]
    assert [c.mode for c in guarded.comparisons] == ["full_rewrite", "zero_shot"]
    assert guarded.comparisons[1].p_worse == pytest.approx(one_sided_mcnemar(6, 0))
    assert "significantly worse in zero_shot (p = 0.0156)" in guarded.reason

    # a guard mode that holds level passes; one missing from the evaluations is refused
    steady = results("validation", CANDIDATE, full_rewrite=set(TASKS[:9]), zero_shot=set(TASKS[:6]))
    assert decide(0, steady, incumbent, PromotionConfig(guard_modes=["zero_shot"])).promote
    with pytest.raises(CorruptInputError, match="lack the 'zero_shot' mode"):
        decide(
            0,
            results("validation", CANDIDATE, full_rewrite=set(TASKS[:9])),
            results("validation", BASE, full_rewrite=set(TASKS[:2])),
            PromotionConfig(guard_modes=["zero_shot"]),
        )


def test_result_and_decision_files_written_before_sampled_answers_still_load() -> None:
    """Committed files of the learning curve (no sampled answers, no guard modes) load, and
    promotion decides on them as it did."""
    folder = REPO / "docs/results/learning-curve-whole/round-0-evaluate"
    candidate = EvalResults.load(folder / "candidate-validation.json")
    incumbent = EvalResults.load(folder / "incumbent-validation.json")
    assert candidate.modes["full_rewrite"].sampled is None
    recorded = PromotionDecision.model_validate_json((folder / "decision.json").read_text())
    assert recorded.samples == 0 and recorded.guard_modes == []
    again = decide(0, candidate, incumbent, PromotionConfig(guard_modes=[]))
    assert again.promote == recorded.promote
    assert again.comparisons[0].p_better == recorded.comparisons[0].p_better
    assert again.reason == recorded.reason


def test_a_guard_mode_that_asks_what_the_gate_asks_is_refused() -> None:
    """Under search.prompt 'plain' zero_shot and full_rewrite send one greedy request: a guard
    that repeats the gate's answers can never catch a loss, so the config says so."""
    from codeq.config import load_config
    from codeq.errors import ConfigError

    guarded = {"modes": ["full_rewrite"], "guard_modes": ["zero_shot"]}
    with pytest.raises(ConfigError, match="repeats their answers") as refused:
        load_config(overrides={"promotion": guarded, "search": {"prompt": "plain"}})
    assert "search.prompt 'detailed'" in str(refused.value)
    detailed = load_config(overrides={"promotion": guarded, "search": {"prompt": "detailed"}})
    assert detailed.promotion.guard_modes == ["zero_shot"]
    both_gate = {"modes": ["full_rewrite", "zero_shot"], "guard_modes": []}
    assert load_config(overrides={"promotion": both_gate}).promotion.modes[1] == "zero_shot"


def test_the_new_keys_at_their_old_values_leave_stage_fingerprints_unchanged() -> None:
    """promotion.samples 0 and guard_modes [] reproduce the rule before these keys: left out of
    the evaluate and promote fingerprints, so earlier runs resume; other values are in them."""
    from codeq.config import load_config
    from codeq.pipeline.fingerprint import stage_config

    before = load_config(overrides={"promotion": {"samples": 0, "guard_modes": []}})
    guarded = {"samples": 8, "guard_modes": ["zero_shot"], "reach_guard": True}
    after = load_config(overrides={"promotion": guarded, "search": {"prompt": "detailed"}})
    for stage in ("evaluate", "promote"):
        assert "promotion.samples" not in stage_config(before, stage)
        assert "promotion.guard_modes" not in stage_config(before, stage)
        assert stage_config(after, stage)["promotion.samples"] == 8
        assert stage_config(after, stage)["promotion.guard_modes"] == ["zero_shot"]
    assert "promotion.reach_guard" not in stage_config(before, "promote")
    assert stage_config(after, "promote")["promotion.reach_guard"] is True


@pytest.mark.slow
def test_a_round_evaluates_sampled_answers_and_guard_modes_and_decides_on_them(
    tiny_model_dir, tmp_path
):
    """A whole local round with the tiny model, promotion.samples 2 and the zero_shot guard:
    the validation evaluations hold both modes and 2 sampled answers per task in the gate
    mode, and the decision uses the sign-flip test on them and checks the guard."""
    from test_round import TINY_SETTINGS, OracleOrWrongPolicy

    from codeq.config import load_config
    from codeq.pipeline.local_round import LOCAL_ROUND_PRESET, run_round
    from codeq.pipeline.stages import StageContext, prepare_stage
    from codeq.schemas import Task, read_jsonl

    config = load_config(
        LOCAL_ROUND_PRESET,
        {
            **TINY_SETTINGS,
            "policy": {**TINY_SETTINGS["policy"], "model": str(tiny_model_dir)},
            "promotion": {"max_tasks": 2, "samples": 2, "guard_modes": ["zero_shot"]},
            # a guard asks another prompt than the gate: zero_shot's plain one
            "search": {**TINY_SETTINGS["search"], "prompt": "detailed"},
            "store": {"uri": f"file://{tmp_path}/store", "run": "sampled"},
        },
    )
    store = open_store(config.store)
    prepare_stage(StageContext(config, store, tmp_path / "prepare"), "builtin")
    train_tasks = read_jsonl(tmp_path / "prepare/round-0/tasks/train.jsonl", Task)
    run_round(
        config,
        tmp_path / "out",
        source="builtin",
        engines={"collect": OracleOrWrongPolicy(train_tasks)},
    )
    layout = RoundLayout("sampled", 0)
    for role in ("candidate", "incumbent"):
        validation = EvalResults.model_validate(
            store.get_json(layout.stage("eval") + f"/{role}/validation/results.json")
        )
        assert set(validation.modes) == {"full_rewrite", "zero_shot"}
        sampled = validation.modes["full_rewrite"].sampled
        assert sampled is not None and sampled.samples == 2
        assert set(sampled.per_task) == set(validation.task_ids)
        assert validation.modes["zero_shot"].sampled is None
    decision = PromotionDecision.model_validate(
        store.get_json(layout.stage("promote") + "/decision.json")
    )
    assert decision.samples == 2 and decision.guard_modes == ["zero_shot"]
    assert [c.mode for c in decision.comparisons] == ["full_rewrite", "zero_shot"]
    assert decision.comparisons[0].test == "sign_flip"
    assert decision.comparisons[0].pass_counts.answers == 3 * decision.comparisons[0].tasks
    assert "sign-flip" in decision.reason


@pytest.mark.slow
def test_the_power_simulation_runs_and_its_p_values_are_the_exact_ones(tmp_path) -> None:
    """bench/promotion_power.py in small: its FFT p-values equal the exact counting's, and in
    its fitted model sampled answers see a +5-point gain more often than greedy answers."""
    import subprocess
    import sys

    out = tmp_path / "power.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/promotion_power.py"),
            "--replicates=1000",
            "--null-replicates=1000",
            "--reference-draws=10000",
            "--samples=0,8",
            "--effects=5",
            "--reach-guard",
            f"--json={out}",
        ],
        check=True,
        capture_output=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    power = json.loads(out.read_text())
    assert power["fft_vs_exact_max_gap"] < 1e-9
    diffuse = power["models"]["diffuse"]["promotion_rate"]
    assert diffuse["+5 points"]["k=8"] > diffuse["+5 points"]["today"] + 0.15
    for column in ("exchangeable", "mean-zero churn"):
        assert all(rate < 0.07 for rate in diffuse[column].values())
    # the reach guard only ever blocks: never more promotions than without it
    for column, rates in diffuse.items():
        assert rates["k=8, reach guard"] <= rates["k=8"], column


def test_a_forced_round_promotes_a_candidate_the_tests_keep_out() -> None:
    """promotion.force_rounds: the operator's override. The tests still run and are written;
    other rounds are decided by the tests; a round with no candidate promotes nothing."""
    candidate = results("validation", CANDIDATE, full_rewrite=set(TASKS[:2]))
    incumbent = results("validation", BASE, full_rewrite=set(TASKS[:3]))
    config = PromotionConfig(modes=["full_rewrite"], guard_modes=[], force_rounds=[1])
    forced = decide(1, candidate, incumbent, config)
    assert forced.promote and forced.forced and forced.candidate == CANDIDATE
    assert forced.reason.startswith("PROMOTED by promotion.force_rounds (round 1)")
    assert "the tests alone: kept the incumbent" in forced.reason
    assert forced.comparisons[0].lost == [TASKS[2]]
    unforced = decide(2, candidate, incumbent, config)
    assert not unforced.promote and not unforced.forced
    nothing = decide(1, None, None, config)
    assert not nothing.promote and not nothing.forced


def test_held_out_evaluation_steps_choose_the_adapter_kept_so_they_are_fingerprinted() -> None:
    """train.eval_steps decides which steps' adapters compete for the best held-out accuracy:
    a train stage at another value must not be skipped as done; at 4, the value the committed
    curve rounds trained with before it was fingerprinted, it stays out."""
    from codeq.config import load_config
    from codeq.pipeline.fingerprint import stage_config

    assert "train.eval_steps" not in stage_config(
        load_config(overrides={"train": {"eval_steps": 4}}), "train"
    )
    assert stage_config(load_config(), "train")["train.eval_steps"] == 10
    assert (
        stage_config(load_config(overrides={"train": {"eval_steps": 8}}), "train")[
            "train.eval_steps"
        ]
        == 8
    )


def test_the_reach_section_quotes_the_committed_figures() -> None:
    """docs/promotion-power.md's reach tables are the committed simulation's and the rounds'
    (round-training.md, generated from the committed rounds), so a figure typed wrong fails."""
    page = (REPO / "docs/promotion-power.md").read_text()
    power = json.loads(
        (REPO / "docs/results/promotion-power/reach-guard-loss-per-gain-0.3.json").read_text()
    )
    columns = ["exchangeable", "mean-zero churn", "+3 points", "+5 points", "+8 points"]
    rules = {
        "k=8": "k = 8, zero_shot guard",
        "k=8, reach guard": "k = 8, zero_shot and reach guards",
    }
    for model in ("diffuse", "sparse"):
        rates = power["models"][model]["promotion_rate"]
        for key, label in rules.items():
            cells = " | ".join(f"{rates[column][key]:.3f}" for column in columns)
            assert f"| {model} | {label} | {cells} |" in page
    training = (REPO / "docs/results/learning-curve-defaults/round-training.md").read_text()
    for number in (15, 16):
        (line,) = [row for row in training.splitlines() if row.startswith(f"| {number} | 9 | ")]
        cells = line.split(" | ")
        assert " | ".join([cells[0], *cells[2:]]) in page
