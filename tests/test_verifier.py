"""The learned verifier: it learns from the programs a round wrote (labels from all tests),
its LoRA and score head change, it ranks held-out programs by a signal it can learn, it is
refused on another base model, and it breaks ties among answers."""

from __future__ import annotations

import pytest

from codeq.config import CodeQConfig
from codeq.errors import BadInputError, VerifierLineageError
from codeq.schemas import Lineage, Node, Task, Trajectory, Verdict
from codeq.schemas import TestCase as Case
from codeq.verifier import (
    Program,
    Verifier,
    nothing_to_learn,
    rank_auc,
    read_info,
    train_verifier,
    within_task_auc,
    written_programs,
)
from codeq.verifier.data import within_task_pairs
from tests.preemption import preempted_after_checkpoint

BUGGY = "class Solution:\n    def add(self, a, b):\n        return a - b\n"
# what a variant returns -> whether it passes all tests (a constant 3 passes the visible one)
EXPRESSIONS = {"a + b": True, "a - b": False, "a * b": False, "3": False}


def make_task(index: int) -> Task:
    call = {"kind": "function", "method": "add", "args": [1, 2], "arg_kinds": ["plain", "plain"]}
    return Task(
        task_id=f"t{index}",
        slug=f"add-{index}",
        level="easy",
        category="logic",
        subtype="operation error",
        description=f"Return the sum of a and b (problem {index}).",
        examples=["Input: a = 1, b = 2\nOutput: 3"],
        buggy_code=BUGGY,
        oracle_code=BUGGY.replace("-", "+"),
        entry={"kind": "function", "method": "add"},
        visible_tests=[Case(call=call, expected=3)],
        hidden_tests=[Case(call={**call, "args": [2, 2]}, expected=4, origin="generated")],
    )


def variant(expression: str, index: int) -> str:
    name = ["total", "result", "value", "out", "answer", "s"][index % 6]
    return (
        f"class Solution:\n    def add(self, a, b):\n        {name} = {index}\n"
        f"        return {expression}\n"
    )


def toy_programs(tasks: list[Task]) -> list[Program]:
    """Per task: variants returning a + b pass, the others fail (a signal in the code)."""
    return [
        Program(task, variant(expression, index), passed)
        for task in tasks
        for index in range(3)
        for expression, passed in EXPRESSIONS.items()
    ]


def verifier_config(model_dir, **changes) -> CodeQConfig:
    settings = {
        "enabled": True,
        "lora_r": 8,
        "lora_alpha": 16,
        "learning_rate": 5e-3,
        "epochs": 12,
        "batch_size": 8,
        "max_length": 192,
        "eval_fraction": 0.25,
        **changes,
    }
    return CodeQConfig(policy={"model": str(model_dir), "device": "cpu"}, verifier=settings)


def base_of(config: CodeQConfig) -> Lineage:
    from codeq.train.lineage import base_lineage

    return base_lineage(config.policy)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    config = verifier_config(tiny_model_dir)
    out = tmp_path_factory.mktemp("verifier")
    tasks = [make_task(i) for i in range(12)]
    metrics = train_verifier(toy_programs(tasks[:8]), out, config, base=base_of(config))
    return config, out / "verifier", metrics


def test_the_verifier_learns_a_separable_signal_and_ranks_held_out_programs(trained) -> None:
    config, folder, metrics = trained
    assert metrics["heldout_auc"] is not None and metrics["heldout_auc"] >= 0.8, metrics
    verifier = Verifier.load(folder, config, base_of(config))
    unseen = [make_task(i) for i in range(8, 12)]  # problems it never trained on
    items = toy_programs(unseen)
    scores = verifier.score([(item.task, item.program) for item in items])
    assert all(0.0 <= score <= 1.0 for score in scores)
    auc = rank_auc(scores, [bool(item.passed) for item in items])
    assert auc is not None and auc >= 0.8, auc


def test_training_changes_the_lora_and_the_score_head(trained, tiny_model_dir) -> None:
    import torch
    from safetensors.torch import load_file

    config, folder, _ = trained
    weights = load_file(str(folder / "adapter_model.safetensors"))
    lora_b = [tensor for name, tensor in weights.items() if "lora_B" in name]
    assert lora_b and any(torch.count_nonzero(t) > 0 for t in lora_b)  # B starts at zero
    heads = [tensor for name, tensor in weights.items() if "score" in name]
    assert heads, sorted(weights)
    from codeq.verifier.model import load_classifier

    torch.manual_seed(0)
    untrained = load_classifier(str(tiny_model_dir), torch.float32, 0).score.weight
    assert not torch.allclose(heads[0].float(), untrained.float())
    info = read_info(folder)
    assert info.base == base_of(config) and info.heldout_auc == trained[2]["heldout_auc"]


def test_a_verifier_of_another_base_model_is_refused_naming_both(trained) -> None:
    config, folder, _ = trained
    other = Lineage(base_model="Qwen/Qwen2.5-Coder-7B-Instruct", base_sha256="f" * 64)
    with pytest.raises(VerifierLineageError) as caught:
        Verifier.load(folder, config, other)
    message = str(caught.value)
    assert "Qwen/Qwen2.5-Coder-7B-Instruct (ffffffffffff)" in message
    assert base_of(config).describe() in message
    assert caught.value.exit_code == 2


def node(node_id: int, program: str, passed: bool | None, valid: bool = True) -> Node:
    verdict = None
    if passed is not None:
        verdict = Verdict(
            passed=passed, n_passed=int(passed), n_total=1, status="passed", backend="subprocess"
        )
    return Node(id=node_id, parent=0, depth=1, program=program, verdict=verdict, valid=valid)


def test_written_programs_are_the_distinct_valid_rewrites_labelled_by_all_tests() -> None:
    task = make_task(0)
    root = Node(id=0, parent=None, depth=0, program=BUGGY)
    nodes = [
        root,
        node(1, variant("a + b", 0), True),
        node(2, variant("a + b", 0) + "\n", True),  # the same program again
        node(3, variant("a - b", 1), False),
        node(4, "", None, valid=False),
    ]
    trajectory = Trajectory(
        task_id=task.task_id,
        slug=task.slug,
        level="easy",
        category="logic",
        subtype="x",
        mode="mcts",
        reward_tests="all",
        nodes=nodes,
        solved=True,
        final_node=1,
    )
    programs = written_programs([trajectory], {task.task_id: task}, max_per_task=8)
    assert [(p.program, p.passed) for p in programs] == [
        (variant("a + b", 0), True),
        (variant("a - b", 1), False),
    ]
    visible_only = trajectory.model_copy(update={"reward_tests": "visible"})
    assert [p.passed for p in written_programs([visible_only], {task.task_id: task}, 8)] == [
        None,
        None,
    ]
    assert written_programs([trajectory], {task.task_id: task}, max_per_task=1)[0].passed


def test_nothing_to_learn_without_both_classes(tiny_model_dir, tmp_path) -> None:
    task = make_task(0)
    only_failing = [Program(task, variant("a - b", i), False) for i in range(3)]
    assert "none of the 3 programs" in (nothing_to_learn(only_failing) or "")
    config = verifier_config(tiny_model_dir)
    with pytest.raises(BadInputError, match="cannot train a verifier"):
        train_verifier(only_failing, tmp_path, config, base=base_of(config))


def test_rank_auc_counts_ties_half_and_needs_both_labels() -> None:
    assert rank_auc([0.9, 0.1], [True, False]) == 1.0
    assert rank_auc([0.5, 0.5], [True, False]) == 0.5
    assert rank_auc([0.2, 0.8, 0.6, 0.1], [True, False, True, False]) == 0.5
    assert rank_auc([0.2], [True]) is None


def test_the_within_task_auc_ignores_telling_easy_tasks_from_hard_ones() -> None:
    from codeq.verifier import within_task_auc

    # solved tasks score high and unsolved ones low, but within the one mixed task the failing
    # program outscores the passing one: the plain AUC is high, a choice within a task is wrong
    tasks = ["solved", "solved too", "failed", "failed too", "mixed", "mixed"]
    scores = [0.9, 0.85, 0.1, 0.15, 0.5, 0.6]
    labels = [True, True, False, False, True, False]
    assert rank_auc(scores, labels) == 8 / 9
    assert within_task_auc(tasks, scores, labels) == {"auc": 0.0, "tasks": 1, "pairs": 1}
    assert within_task_auc(tasks, [*scores[:4], 0.6, 0.5], labels)["auc"] == 1.0
    assert within_task_auc(tasks, [*scores[:4], 0.5, 0.5], labels)["auc"] == 0.5
    assert within_task_auc(tasks[:4], scores[:4], labels[:4]) == {
        "auc": None,
        "tasks": 0,
        "pairs": 0,
    }


def test_the_auc_interval_resamples_tasks_and_holds_the_estimate() -> None:
    from codeq.verifier import auc_interval

    tasks = [f"t{i // 3}" for i in range(60)]
    labels = [i % 3 == 0 for i in range(60)]
    scores = [(0.6 if label else 0.4) + (i % 7) / 20 for i, label in enumerate(labels)]
    low, high = auc_interval(tasks, scores, labels, draws=400)
    assert low <= rank_auc(scores, labels) <= high and low < high
    assert auc_interval(tasks, scores, labels, draws=400) == (low, high)  # seeded
    assert auc_interval(["a"], [0.3], [True]) is None


def test_the_within_task_interval_resamples_mixed_tasks_only() -> None:
    from codeq.verifier import within_task_auc, within_task_interval

    # 20 mixed tasks of 3 programs: the passing one scores above both failing ones in 15
    # tasks and below them in 5 (within-task AUC 0.75); tasks of one label add nothing
    tasks, scores, labels = [], [], []
    for task in range(20):
        right = task < 15
        tasks += [f"t{task}"] * 3
        scores += [0.8 if right else 0.2, 0.5, 0.4]
        labels += [True, False, False]
    tasks += ["all pass", "all pass", "all fail"]
    scores += [0.1, 0.9, 0.3]
    labels += [True, True, False]
    estimate = within_task_auc(tasks, scores, labels)["auc"]
    assert estimate == 0.75
    low, high = within_task_interval(tasks, scores, labels, draws=400)
    assert 0.5 < low <= estimate <= high < 1.0
    assert within_task_interval(tasks, scores, labels, draws=400) == (low, high)  # seeded
    assert within_task_interval(tasks[:60], scores[:60], labels[:60], draws=400) == (low, high)
    assert within_task_interval(["a", "b"], [0.3, 0.4], [True, False]) is None


class FakeVerifier:
    """Scores from a table; records what it was asked to score."""

    id = "fake"

    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores
        self.asked: list[str] = []

    def score(self, items):
        self.asked += [program for _, program in items]
        return [self.scores[program] for _, program in items]


def test_the_tie_break_scores_only_the_rewrites_tied_at_the_top() -> None:
    from codeq.search.tree import final_answer
    from codeq.verifier import VerifierTieBreak

    task = make_task(0)
    root = Node(id=0, parent=None, depth=0, program=BUGGY)
    constant, plus, minus = variant("3", 0), variant("a + b", 1), variant("a - b", 2)
    fake = FakeVerifier({constant: 0.2, plus: 0.9})
    tie_break = VerifierTieBreak(fake)  # type: ignore[arg-type]
    tied = [node(1, constant, True), node(2, plus, True), node(3, minus, False)]
    assert final_answer(tied, root, task).program == constant  # no critique: the earlier
    assert final_answer(tied, root, task, tie_break).program == plus
    assert sorted(fake.asked) == sorted([constant, plus]) and tie_break.decided == 1
    alone = [node(1, plus, True), node(2, minus, False), node(3, constant, False)]
    assert final_answer(alone, root, task, tie_break).program == plus
    assert len(fake.asked) == 2 and tie_break.decided == 1  # one best program: nothing to ask


def test_a_stopped_verifier_resumes_from_the_store_and_matches_an_uninterrupted_one(
    tmp_path, tiny_model_dir, monkeypatch
) -> None:
    import torch
    from safetensors.torch import load_file

    import codeq.verifier.train as verifier_train
    from codeq.config import StoreConfig
    from codeq.store import FileStore
    from codeq.train.checkpoints import CheckpointTarget, download_latest, latest

    programs = toy_programs([make_task(i) for i in range(4)])
    target = CheckpointTarget(StoreConfig(uri=f"file://{tmp_path / 'store'}"), "progress", {})
    unchecked = verifier_config(tiny_model_dir, max_steps=4, checkpoint_every_s=0)
    whole = train_verifier(programs, tmp_path / "whole", unchecked, base=base_of(unchecked))
    assert latest(FileStore(tmp_path / "store"), "progress") is None

    config = verifier_config(tiny_model_dir, max_steps=4, checkpoint_every_s=1e-9)
    with preempted_after_checkpoint(monkeypatch, verifier_train, step=2):
        train_verifier(
            programs, tmp_path / "stopped", config, base=base_of(config), checkpoints=target
        )
    assert not (tmp_path / "stopped" / "verifier").exists()

    checkpoint = download_latest(FileStore(tmp_path / "store"), "progress", tmp_path / "down")
    resumed = train_verifier(
        programs,
        tmp_path / "resumed",
        config,
        base=base_of(config),
        checkpoints=target,
        resume_from=checkpoint,
    )
    assert resumed["resumed_from_step"] == 2 and whole["resumed_from_step"] is None
    assert resumed["global_steps"] == whole["global_steps"] == 4
    assert [s["loss"] for s in resumed["steps"]] == pytest.approx(
        [s["loss"] for s in whole["steps"]], rel=1e-5
    )
    assert resumed["heldout_auc"] == whole["heldout_auc"]
    expected = load_file(str(tmp_path / "whole" / "verifier" / "adapter_model.safetensors"))
    got = load_file(str(tmp_path / "resumed" / "verifier" / "adapter_model.safetensors"))
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.allclose(expected[name], got[name], atol=1e-6), name
    assert not (tmp_path / "resumed" / "checkpoints").exists()  # spent once the verifier is written


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pairwise_training_learns_which_program_of_a_task_passes(tiny_model_dir, tmp_path, dtype):
    """TRL reward training on (passing, failing) programs of one task: the LoRA and score head
    change, and on problems it never saw it ranks a task's passing programs above its failing
    ones (the within-task AUC, what choosing among one task's candidates needs). In bf16 (the
    faster choice on a CPU with AVX512-BF16) what trains is kept in float32, the head too."""
    from safetensors.torch import load_file

    config = verifier_config(tiny_model_dir, objective="pairwise", pairs_per_task=8, epochs=6)
    policy = config.policy.model_copy(update={"dtype": dtype})
    config = config.model_copy(update={"policy": policy})
    tasks = [make_task(i) for i in range(12)]
    metrics = train_verifier(toy_programs(tasks[:8]), tmp_path, config, base=base_of(config))
    folder = tmp_path / "verifier"
    assert read_info(folder).objective == "pairwise"
    assert metrics["heldout_within_task"]["pairs"] > 0
    weights = load_file(str(folder / "adapter_model.safetensors"))
    assert any("lora_B" in name and tensor.abs().sum() > 0 for name, tensor in weights.items())
    assert {str(tensor.dtype) for tensor in weights.values()} == {"torch.float32"}
    assert metrics["steps"][0]["loss"] > metrics["steps"][-1]["loss"]

    items = toy_programs(tasks[8:])  # problems it never trained on
    scores = Verifier.load(folder, config, base_of(config)).score(
        [(item.task, item.program) for item in items]
    )
    ranked = within_task_auc(
        [item.task.task_id for item in items], scores, [bool(item.passed) for item in items]
    )
    assert ranked["auc"] is not None and ranked["auc"] >= 0.8, ranked


def test_within_task_pairs_pair_one_tasks_programs_and_cap_each_task() -> None:
    tasks = [make_task(0), make_task(1)]
    programs = toy_programs(tasks)  # per task 3 passing, 9 failing: 27 pairs
    pairs = within_task_pairs(programs, per_task=5, seed=0)
    assert len(pairs) == 10
    assert all(good.passed and bad.passed is False for good, bad in pairs)
    assert all(good.task.task_id == bad.task.task_id for good, bad in pairs)
    assert pairs == within_task_pairs(programs, per_task=5, seed=0)  # seeded
    assert len(within_task_pairs(programs, per_task=100, seed=0)) == 54

    apart = [Program(tasks[0], "a", True), Program(tasks[1], "b", False)]
    assert nothing_to_learn(apart) is None  # pointwise learns from these
    assert "no task has both a passing and a failing program" in nothing_to_learn(apart, True)
