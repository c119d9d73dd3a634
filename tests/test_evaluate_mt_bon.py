"""Multi-turn best-of-N in evaluation and in a round: read at every turn budget t beside
best-of-(N x t) at equal programs; end to end with the tiny model's engine, and a whole local
round that collects with it (its pairs from each turn's siblings) and evaluates with it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_evaluate import ScriptedPolicy
from test_round import TINY_SETTINGS, OracleOrWrongPolicy

from codeq import cli
from codeq.config import load_config
from codeq.evaluate import evaluate
from codeq.evaluate.results import EvalResults
from codeq.schemas import Task, Trajectory, read_jsonl

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(out)]) == 0
    return out / "train.jsonl"


def compare_evals():
    spec = importlib.util.spec_from_file_location("compare_evals", BENCH / "compare_evals.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mt_bon_is_read_at_every_turn_beside_best_of_n_at_equal_programs(tasks_file, tmp_path):
    """'late' fixes a task only when asked to refine its own wrong rewrite: the second turn
    does, a best-of-N sample (always of the buggy program) never does."""
    tasks = read_jsonl(tasks_file, Task)[:3]
    first, second, third = (task.task_id for task in tasks)
    plans = {first: "fix", second: "late", third: "never"}
    config = load_config(
        overrides={
            "search": {
                "rollouts": 2,
                "rewrites_per_expansion": 1,
                "bon_samples": 2,
                "mt_bon_samples": 2,
                "mt_bon_turns": 3,
            },
            "evaluate": {"max_tasks": 3, "rollout_ablation": [1, 2], "modes": ["bon", "mt_bon"]},
            "sandbox": {"backend": "subprocess", "workers": 2},
        }
    )
    policy = ScriptedPolicy(tasks, plans)
    results = evaluate(tasks_file, tmp_path, config, engine=policy)

    assert list(results.modes) == ["bon", "mt_bon"] and results.primary_mode == "bon"
    ablation = results.mt_bon_ablation
    assert list(ablation) == ["1", "2", "3"]
    assert ablation["1"].per_task == {first: True, second: False, third: False}
    assert ablation["2"].per_task == {first: True, second: True, third: False}
    assert results.modes["mt_bon"] == ablation["3"]
    assert (results.modes["mt_bon"].rollouts, results.modes["mt_bon"].samples) == (3, 2)
    # programs: a pass at turn 1 (first) or 2 (second) stops; 'never' writes all N x T
    assert [ablation[t].programs for t in "123"] == pytest.approx([2, 10 / 3, 4])
    assert ablation["3"].completion_tokens is not None and ablation["1"].completion_tokens is None
    # best-of-N at each turn budget's programs (2, 4, 6), sampled from the buggy program only
    assert {"2", "4", "6"} <= set(results.bon_ablation)
    for size in ("2", "4", "6"):
        assert results.bon_ablation[size].per_task == {first: True, second: False, third: False}
    trees = read_jsonl(tmp_path / "trajectories-mt_bon.jsonl", Trajectory)
    assert [t.mode for t in trees] == ["mt_bon"] * 3
    assert [len(t.nodes) - 1 for t in trees] == [2, 4, 6]
    assert all(t.reward_tests == "visible" for t in trees)
    assert EvalResults.load(tmp_path) == results

    # the paired comparison names the figures by N x t and pairs them at equal programs
    module = compare_evals()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert {"mt_bon@2x1", "mt_bon@2x2", "mt_bon@2x3", "bon@4"} <= set(module.figures(saved))
    [row] = module.compare(saved, saved, [("mt_bon@2x2", "bon@4")])
    assert (row["first"], row["second"], row["gained"], row["lost"]) == (2, 1, 1, 0)

    # an evaluation of the same policy resumes the finished search; more turns search afresh
    again = ScriptedPolicy(tasks, plans)
    resumed = evaluate(tasks_file, tmp_path, config, engine=again)
    assert {t: r.per_task for t, r in resumed.mt_bon_ablation.items()} == {
        t: r.per_task for t, r in ablation.items()
    }
    assert not again.calls, "the finished evaluation was searched again"
    more = config.derive(search={"mt_bon_turns": 4})
    again = ScriptedPolicy(tasks, plans)
    assert list(evaluate(tasks_file, tmp_path, more, engine=again).mt_bon_ablation) == list("1234")
    assert third in again.calls


def test_adding_mt_bon_leaves_the_other_modes_results_unchanged(tasks_file, tmp_path):
    """Without mt_bon among evaluate.modes, best-of-N's sizes (and its resume key) are what
    they were; with it, only sizes are added."""
    tasks = read_jsonl(tasks_file, Task)[:2]
    plans = {tasks[0].task_id: "fix", tasks[1].task_id: "never"}
    search = {"rollouts": 2, "rewrites_per_expansion": 1, "bon_samples": 2}
    base = {"max_tasks": 2, "rollout_ablation": [1, 2]}

    def run(modes: list[str], out: str) -> EvalResults:
        config = load_config(
            overrides={
                "search": search,
                "evaluate": {**base, "modes": modes},
                "sandbox": {"backend": "subprocess", "workers": 2},
            }
        )
        return evaluate(tasks_file, tmp_path / out, config, engine=ScriptedPolicy(tasks, plans))

    without = run(["bon"], "without")
    assert list(without.bon_ablation) == ["1", "2"]
    with_mt = run(["bon", "mt_bon"], "with")
    assert set(without.bon_ablation) < set(with_mt.bon_ablation)  # 8 x 1..3 added
    assert {"8", "16", "24"} <= set(with_mt.bon_ablation)
    for size, figure in without.bon_ablation.items():
        assert with_mt.bon_ablation[size].per_task == figure.per_task


def test_evaluate_mt_bon_with_the_real_engine_and_the_tiny_model(
    tasks_file, tiny_model_dir, tmp_path
):
    tasks = read_jsonl(tasks_file, Task)[:2]
    config = load_config(
        overrides={
            "policy": {
                "model": str(tiny_model_dir),
                "max_new_tokens": 16,
                "critique_max_new_tokens": 8,
                "cpu_threads": 1,
            },
            "search": {"mt_bon_samples": 2, "mt_bon_turns": 2, "bon_samples": 2},
            "evaluate": {"max_tasks": 2, "modes": ["mt_bon"]},
            "sandbox": {"backend": "subprocess", "workers": 1},
        }
    )
    results = evaluate(tasks_file, tmp_path, config)
    assert list(results.modes) == ["mt_bon"] and list(results.mt_bon_ablation) == ["1", "2"]
    trees = read_jsonl(tmp_path / "trajectories-mt_bon.jsonl", Trajectory)
    for tree, task in zip(trees, tasks, strict=True):
        assert tree.mode == "mt_bon" and tree.reward_tests == "visible"
        assert tree.nodes[0].verdict.n_total == len(task.tests("visible"))
        assert 1 <= len(tree.nodes) - 1 <= 2 * 2 and tree.completion_tokens > 0
        assert {n.rollout for n in tree.nodes[1:]} <= {1, 2}
    assert results.modes["mt_bon"].programs <= 4


@pytest.mark.slow
def test_a_local_round_collects_and_evaluates_with_mt_bon(tiny_model_dir, tmp_path):
    """A whole local round with search.mode mt_bon: collect writes multi-turn trees whose
    pairs come from one turn's siblings (a stand-in policy writes one oracle and one wrong
    rewrite a turn: the tiny random model writes no programs), and the test split is evaluated
    in mt_bon by the real tiny model."""
    from codeq.pipeline.local_round import LOCAL_ROUND_PRESET, run_round
    from codeq.pipeline.stages import StageContext, prepare_stage, round_stages
    from codeq.schemas import Pair
    from codeq.store import RoundLayout, open_store

    config = load_config(
        LOCAL_ROUND_PRESET,
        {
            **TINY_SETTINGS,
            "policy": {**TINY_SETTINGS["policy"], "model": str(tiny_model_dir)},
            "search": {"mode": "mt_bon", "mt_bon_samples": 2, "mt_bon_turns": 2},
            "evaluate": {"modes": ["mt_bon"], "max_tasks": 2},
            "store": {"uri": f"file://{tmp_path / 'store'}", "run": "mtbon"},
        },
    )
    store = open_store(config.store)
    prepare_stage(StageContext(config, store, tmp_path / "prepare"), "builtin")
    train_tasks = read_jsonl(tmp_path / "prepare/round-0/tasks/train.jsonl", Task)
    summary = run_round(
        config, tmp_path / "out", engines={"collect": OracleOrWrongPolicy(train_tasks)}
    )
    assert list(summary["timings"]) == round_stages(config)
    layout = RoundLayout("mtbon", 0)
    trees = [
        Trajectory.model_validate_json(line)
        for line in store.get_bytes(layout.shard(0) + "/trajectories.jsonl").decode().splitlines()
    ]
    assert trees and all(t.mode == "mt_bon" and t.reward_tests == "all" for t in trees)
    assert all(t.solved and len(t.nodes) == 3 for t in trees), "the oracle passes at turn 1"
    pairs = [
        Pair.model_validate_json(line)
        for line in store.get_bytes(layout.stage("pairs") + "/pairs.jsonl").decode().splitlines()
    ]
    assert len(pairs) == len(trees)
    prompts = {t.task_id: t.nodes[1].prompt for t in trees}
    assert all(pair.prompt == prompts[pair.task_id] for pair in pairs)
    results = EvalResults.model_validate_json(
        store.get_bytes(layout.stage("eval") + "/candidate/test/results.json")
    )
    assert list(results.modes) == ["mt_bon"] and list(results.mt_bon_ablation) == ["1", "2"]
    assert store.exists(layout.stage("report") + "/index.html")
