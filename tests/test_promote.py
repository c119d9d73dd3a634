"""Promotion: the candidate becomes the run's current policy only when it solves significantly
more of the same validation tasks than the incumbent (one-sided exact McNemar) and is not
significantly worse in any promotion mode; the test split never enters the decision."""

from __future__ import annotations

import json
import random

import pytest

from codeq.cli import run as cli_run
from codeq.config import PromotionConfig, StoreConfig
from codeq.evaluate.results import EvalResults, ModeResult
from codeq.promotion import decide, one_sided_mcnemar
from codeq.schemas import AdapterLink, Lineage
from codeq.store import RoundLayout, open_store

BASE = Lineage(base_model="smollm2", base_sha256="b" * 64)
CANDIDATE = BASE.extended(AdapterLink(round=0, sha256="c" * 64, source="runs/r1/round-0/adapter"))
TASKS = [f"t{i}" for i in range(12)]


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
