"""Execution agreement as the final answer's tie-break: probe inputs made like hidden-test
inputs (from another seed, with no expected output), and among the rewrites tied on the
visible tests the behaviour most of them share on those probes first."""

from __future__ import annotations

import pytest

from codeq.config import SandboxConfig
from codeq.sandbox import Sandbox
from codeq.schemas import Node, Task
from codeq.schemas import TestCase as Case
from codeq.search.agreement import AgreementTieBreak
from codeq.search.tree import final_answer
from codeq.tasks import score_programs
from codeq.tasks.harness import detect_entry, make_call
from codeq.tasks.literals import parse_example
from codeq.tasks.probes import probe_calls
from tests.scripted import CyclingAnswers

EXAMPLE = "Input: a = 1, b = 2\nOutput: 3"
ORACLE = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b\n"


def add_task(examples: list[str] | None = None) -> Task:
    entry = detect_entry(ORACLE, parse_example(EXAMPLE))
    visible = Case(call=make_call(entry, parse_example(EXAMPLE)), expected=3)
    hidden = Case(call={**visible.call, "args": [5, 7]}, expected=12, origin="generated")
    return Task(
        task_id="add0",
        slug="add-two-integers",
        level="easy",
        category="logic",
        subtype="operation error",
        description="Return the sum of a and b.",
        examples=[EXAMPLE] if examples is None else examples,
        constraints="-100 <= a, b <= 100",
        buggy_code=ORACLE.replace("+", "-"),
        oracle_code=ORACLE,
        entry=entry,
        visible_tests=[visible],
        hidden_tests=[hidden],
    )


def program(expression: str) -> str:
    return ORACLE.replace("a + b", expression)


def three_answers() -> CyclingAnswers:
    """The constant 3 first, then a + b and b + a: all pass the visible test, only the sums
    the hidden one."""
    return CyclingAnswers([program(e) for e in ("3", "a + b", "b + a")], "three-answers")


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(SandboxConfig(backend="subprocess", workers=1)) as running:
        yield running


def rewrites(task: Task, expressions: list[str], sandbox) -> list[Node]:
    programs = [program(e) for e in expressions]
    verdicts = score_programs([(task, p) for p in programs], "visible", sandbox)
    return [
        Node(id=i + 1, parent=0, depth=1, rollout=1, program=p, verdict=v)
        for i, (p, v) in enumerate(zip(programs, verdicts, strict=True))
    ]


def prefers_constants(task: Task, nodes) -> list[float]:
    """A scorer that likes exactly the wrong answer (as the critique may)."""
    return [1.0 if "return 3" in node.program else 0.0 for node in nodes]


def test_probe_inputs_are_seeded_new_inputs_without_expected_outputs():
    task = add_task()
    calls = probe_calls(task, 6, seed=0)
    assert len(calls) == 6
    assert task.visible_tests[0].call not in calls  # none equal to an example
    assert all(set(call) == set(task.visible_tests[0].call) for call in calls)
    assert probe_calls(task, 6, seed=0) == calls  # the same seed, the same probes
    assert probe_calls(task, 6, seed=1) != calls
    assert probe_calls(add_task(examples=["no example here"]), 6, seed=0) == []


def test_the_behaviour_most_tied_rewrites_share_is_the_answer(sandbox):
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    # all three pass the visible test (1 + 2 = 3); the constant fails every other input
    nodes = rewrites(task, ["a + b", "b + a", "3"], sandbox)
    assert all(node.verdict.passed for node in nodes)
    assert "return 3" in final_answer(nodes, root, task, prefers_constants).program
    agreement = AgreementTieBreak(sandbox, probes=6, seed=0, then=prefers_constants)
    chosen = final_answer(nodes, root, task, agreement)
    assert chosen.program in {program("a + b"), program("b + a")}
    assert (agreement.decided, agreement.probed) == (1, 1)
    # repeated samples count: three samples of the constant outvote the two sums
    repeated = rewrites(task, ["a + b", "b + a", "3", "3", "3"], sandbox)
    assert "return 3" in final_answer(repeated, root, task, agreement).program


def test_programs_that_raise_alike_do_not_outvote_those_that_answer(sandbox):
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    raising = [
        "a + b if a == 1 else 1 // 0",
        "(a + b) if a == 1 else 1 // 0",
        "b + a if a == 1 else 1 // 0",
    ]
    nodes = rewrites(task, ["a + b", "b + a", *raising], sandbox)
    assert all(node.verdict.passed for node in nodes)  # add(1, 2): every one answers 3
    by_size = AgreementTieBreak(sandbox, 6, 0, prefers_constants, answered_first=False)
    assert "1 // 0" in final_answer(nodes, root, task, by_size).program  # three raise alike
    answered = AgreementTieBreak(sandbox, probes=6, seed=0, then=prefers_constants)  # default
    chosen = final_answer(nodes, root, task, answered)
    assert chosen.program in {program("a + b"), program("b + a")}
    assert by_size.__qualname__ != answered.__qualname__  # resume keys tell them apart


def test_agreement_defers_where_it_cannot_decide(sandbox):
    task = add_task()
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    agreement = AgreementTieBreak(sandbox, probes=6, seed=0, then=prefers_constants)
    # one distinct program at the top of the visible tests: nothing to run
    nodes = rewrites(task, ["3", "a - b"], sandbox)
    assert "return 3" in final_answer(nodes, root, task, agreement).program
    assert agreement.decided == 0
    # a task without probe inputs: the scorer after it decides
    bare = add_task(examples=["no example here"])
    nodes = rewrites(bare, ["a + b", "3"], sandbox)
    assert "return 3" in final_answer(nodes, root, bare, agreement).program
    assert (agreement.decided, agreement.probed) == (1, 0)


@pytest.mark.parametrize(("probes", "solved"), [(0, 0), (6, 1)])
def test_an_evaluation_answers_by_agreement_when_asked(tmp_path, sandbox, probes, solved):
    from codeq.config import load_config
    from codeq.evaluate import evaluate
    from codeq.schemas import write_jsonl

    tasks = tmp_path / "test.jsonl"
    write_jsonl(tasks, [add_task()])
    config = load_config(
        overrides={
            "search": {"bon_samples": 3, "rollouts": 1, "rewrites_per_expansion": 1},
            "evaluate": {
                "modes": ["bon"],
                "rollout_ablation": [1],
                "tie_break": "critique",
                "agreement_probes": probes,
            },
        }
    )
    results = evaluate(tasks, tmp_path / "eval", config, engine=three_answers(), sandbox=sandbox)
    assert results.modes["bon"].solved == solved
