from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from codeq import cli
from codeq.config import load_config
from codeq.evaluate import ANY_NODE_LABEL, evaluate, summarize, wilson_interval
from codeq.policy import GenerationRequest, GenerationResult
from codeq.schemas import Task, Trajectory, read_jsonl
from tests.scripted import ScriptedEngine, TaskScriptedEngine, prompt_text


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (5, 10, 0.2366, 0.7634),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (81, 263, 0.2553, 0.3662),
        (1, 1, 0.2065, 1.0),
    ],
)
def test_wilson_interval_matches_published_values(successes, n, low, high) -> None:
    got_low, got_high = wilson_interval(successes, n, 0.95)
    assert got_low == pytest.approx(low, abs=1e-4)
    assert got_high == pytest.approx(high, abs=1e-4)


def test_wilson_interval_edges() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    narrow = wilson_interval(50, 100, 0.8)
    wide = wilson_interval(50, 100, 0.99)
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1]
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_wilson_interval_contains_the_rate_exactly_at_the_ends() -> None:
    # 0 of 5 left a lower bound of 2.8e-17 above the rate; the report's error bars refused it
    for n in range(1, 101):
        for successes in range(n + 1):
            low, high = wilson_interval(successes, n)
            assert 0.0 <= low <= successes / n <= high <= 1.0
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def make_task(task_id: str, level: str, category: str, subtype: str) -> Task:
    return Task(
        task_id=task_id,
        slug=task_id,
        level=level,  # type: ignore[arg-type]
        category=category,  # type: ignore[arg-type]
        subtype=subtype,
        description="",
        examples=[],
        buggy_code="",
        oracle_code="",
        visible_tests=[],
        hidden_tests=[],
    )


def test_summarize_breaks_down_fixed_outcomes() -> None:
    tasks = [
        make_task("a", "easy", "syntax", "missing colons"),
        make_task("b", "easy", "logic", "condition error"),
        make_task("c", "hard", "logic", "condition error"),
        make_task("d", "hard", "logic", "variable error"),
    ]
    solved = {"a": True, "b": True, "c": False, "d": False}
    summary = summarize(tasks, solved, 0.95)
    assert (summary["n"], summary["solved"], summary["solve_rate"]) == (4, 2, 0.5)
    assert (summary["ci_low"], summary["ci_high"]) == pytest.approx(wilson_interval(2, 4))
    assert summary["by_level"]["easy"]["solve_rate"] == 1.0
    assert summary["by_level"]["hard"]["solve_rate"] == 0.0
    assert summary["by_category"]["logic"]["solved"] == 1
    assert summary["by_category"]["logic"]["n"] == 3
    assert summary["by_subtype"]["condition error"]["solve_rate"] == 0.5
    assert summary["per_task"] == solved


WRONG_MARKER = "UNUSED_MARKER"


class ScriptedPolicy(TaskScriptedEngine):
    """Answers each task with a fixed plan: 'fix' returns the oracle at once, 'late' returns a
    wrong (but valid) rewrite unless asked to refine that wrong rewrite (MCTS's second rollout),
    'never' always returns a wrong rewrite."""

    def __init__(self, tasks: Sequence[Task], plans: dict[str, str]) -> None:
        super().__init__(tasks)
        self.plans = plans
        self.calls: Counter[str] = Counter()

    def samples(self, request: GenerationRequest) -> list[str]:
        task = self.task_of(request)
        plan = self.plans[task.task_id]
        self.calls[task.task_id] += 1
        good = plan == "fix" or (plan == "late" and WRONG_MARKER in prompt_text(request))
        code = task.oracle_code if good else task.buggy_code + f"\n{WRONG_MARKER} = 1\n"
        return [code] * request.n


@pytest.fixture(scope="module")
def test_tasks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(out)]) == 0
    return out / "train.jsonl"


def test_evaluate_scores_one_final_program_per_task_on_all_tests(test_tasks, tmp_path) -> None:
    tasks = read_jsonl(test_tasks, Task)[:3]
    plans = {tasks[0].task_id: "fix", tasks[1].task_id: "late", tasks[2].task_id: "never"}
    config = load_config(
        overrides={
            "search": {"rollouts": 2, "rewrites_per_expansion": 1, "bon_samples": 2},
            "evaluate": {"max_tasks": 3, "rollout_ablation": [1, 2]},
            "sandbox": {"backend": "subprocess", "workers": 2},
        }
    )
    policy = ScriptedPolicy(tasks, plans)
    results = evaluate(test_tasks, tmp_path, config, engine=policy)

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == results.model_dump(mode="json")
    assert saved["scored_on"] == "visible+hidden"
    assert saved["task_ids"] == [t.task_id for t in tasks]
    assert saved["primary_mode"] == "mcts"
    assert list(saved["modes"]) == ["zero_shot", "full_rewrite", "mcts", "bon"]
    first, second, third = (t.task_id for t in tasks)
    # one greedy rewrite, or samples from the buggy root: only the task fixed at once passes
    for mode in ("zero_shot", "full_rewrite", "bon"):
        assert saved["modes"][mode]["per_task"] == {first: True, second: False, third: False}
        assert saved["modes"][mode]["solved"] == 1
    # MCTS with 2 rollouts finds the late fix; with 1 it does not
    assert saved["modes"]["mcts"]["per_task"] == {first: True, second: True, third: False}
    ablation = saved["mcts_rollout_ablation"]
    assert ablation["1"]["per_task"] == {first: True, second: False, third: False}
    assert ablation["2"]["solved"] == 2
    assert saved["any_node_passed"]["label"] == ANY_NODE_LABEL
    assert saved["any_node_passed"]["solved"] == 2
    low, high = wilson_interval(2, 3)
    assert saved["modes"]["mcts"]["ci_low"] == pytest.approx(low)
    assert saved["modes"]["mcts"]["ci_high"] == pytest.approx(high)
    assert set(saved["modes"]["mcts"]["by_level"]) == {t.level for t in tasks}
    assert (tmp_path / "trajectories-mcts.jsonl").is_file()


def test_modes_evaluated_later_add_to_the_earlier_results(test_tasks, tmp_path) -> None:
    """Single-pass modes first, search modes in a later evaluation of the same policy on the
    same tasks: together they are what one evaluation of every mode gives; results of
    different tasks refuse to combine."""
    from codeq.errors import CorruptInputError

    tasks = read_jsonl(test_tasks, Task)[:3]
    plans = {tasks[0].task_id: "fix", tasks[1].task_id: "late", tasks[2].task_id: "never"}

    def run(modes: list[str], out: str, max_tasks: int = 3):
        config = load_config(
            overrides={
                "search": {"rollouts": 2, "rewrites_per_expansion": 1, "bon_samples": 2},
                "evaluate": {"max_tasks": max_tasks, "rollout_ablation": [1, 2], "modes": modes},
                "sandbox": {"backend": "subprocess", "workers": 2},
            }
        )
        return evaluate(test_tasks, tmp_path / out, config, engine=ScriptedPolicy(tasks, plans))

    single = run(["zero_shot", "full_rewrite"], "single")
    assert single.primary_mode == "zero_shot"
    merged = single.with_modes_of(run(["bon", "mcts"], "search"))
    whole = run(["zero_shot", "full_rewrite", "mcts", "bon"], "whole")

    def outcomes(results):
        return {
            "primary": results.primary_mode,
            "modes": {mode: r.per_task for mode, r in results.modes.items()},
            "mcts": {b: r.per_task for b, r in results.mcts_rollout_ablation.items()},
            "bon": {n: r.per_task for n, r in results.bon_ablation.items()},
            "any": results.any_node_passed.per_task,
        }

    assert outcomes(merged) == outcomes(whole)
    assert merged.primary_mode == "mcts"
    assert single.modes.keys() == {"zero_shot", "full_rewrite"}, "the earlier results changed"
    with pytest.raises(CorruptInputError, match="task_ids"):
        single.with_modes_of(run(["bon"], "fewer", max_tasks=2))


def test_the_unchanged_buggy_program_is_never_counted_as_solved(test_tasks) -> None:
    """Returned programs are scored on visible and hidden tests: a buggy program fails at least
    one of them (prepare drops a task whose buggy program passes all), so returning it unchanged
    never counts, even where it passes every hidden test."""
    from codeq.evaluate.run import fully_passed
    from codeq.sandbox import Sandbox

    tasks = read_jsonl(test_tasks, Task)
    config = load_config(overrides={"sandbox": {"backend": "subprocess", "workers": 2}})
    with Sandbox(config.sandbox) as sandbox:
        assert not any(fully_passed(tasks, [t.buggy_code for t in tasks], sandbox).values())
        assert all(fully_passed(tasks, [t.oracle_code for t in tasks], sandbox).values())


SPECIAL_INPUT = 123456789  # a hidden test's input that only the "special" rewrite answers


class TwoRewritesPolicy(ScriptedEngine):
    """Writes two rewrites of count-digits in one request: the oracle, which passes the visible
    tests but not the hidden one below, and the oracle with a special case that passes every
    test; the critique scores the rewrite `preferred` names 9/10 and the other 1/10."""

    name = "two-rewrites"

    def __init__(self, task: Task, preferred: str) -> None:
        special = task.oracle_code.replace(
            "        digits = 1\n",
            f"        if n == {SPECIAL_INPUT}:\n            return -1\n        digits = 1\n",
        )
        assert special != task.oracle_code
        self.programs = {"oracle": task.oracle_code, "special": special}
        self.preferred = preferred

    def critique(self, request: GenerationRequest) -> str:
        shown = "special" if str(SPECIAL_INPUT) in prompt_text(request) else "oracle"
        return f"Score: {9 if shown == self.preferred else 1}/10"

    def samples(self, request: GenerationRequest) -> list[str]:
        programs = [self.programs["oracle"], self.programs["special"]]
        return [programs[i % 2] for i in range(request.n)]


@pytest.mark.parametrize(("preferred", "lost"), [("oracle", True), ("special", False)])
def test_a_search_records_the_tasks_its_choice_of_answer_lost(
    test_tasks, tmp_path, preferred, lost
) -> None:
    """Both rewrites pass the visible tests and the critique breaks the tie; only one passes
    the hidden test too. The task is solvable either way; the choice loses it when the critique
    prefers the other rewrite, and the report's table says so."""
    task = next(t for t in read_jsonl(test_tasks, Task) if t.slug == "count-digits")
    hidden = task.visible_tests[0].model_copy(deep=True)
    hidden.call["args"], hidden.expected = [SPECIAL_INPUT], -1
    task = task.model_copy(update={"hidden_tests": [hidden]})
    tasks_file = tmp_path / "validation.jsonl"
    tasks_file.write_text(task.model_dump_json() + "\n")
    config = load_config(
        overrides={
            "search": {"bon_samples": 2, "rewrites_per_expansion": 1, "rollouts": 1},
            "evaluate": {"modes": ["bon"], "max_tasks": None, "rollout_ablation": [1]},
            "sandbox": {"backend": "subprocess", "workers": 2},
        }
    )
    policy = TwoRewritesPolicy(task, preferred)
    results = evaluate(tasks_file, tmp_path / "eval", config, engine=policy, split="validation")

    selection = results.modes["bon"].selection
    assert selection is not None
    assert (selection.visible_passing, selection.solvable) == (1, [task.task_id])
    assert selection.lost == ([task.task_id] if lost else [])
    assert results.modes["bon"].per_task == {task.task_id: not lost}
    assert results.bon_ablation["1"].selection is None  # only the full budget is judged
    from codeq.report import render_report

    index = render_report(tmp_path / "report", results=tmp_path / "eval")
    summary = json.loads((tmp_path / "report" / "report.json").read_text())
    assert summary["evaluation"]["selection"] == {
        "bon": {"visible_passing": 1, "solvable": 1, "lost": int(lost)}
    }
    assert f"| bon | 1 | 1 | {int(lost)} |" in (tmp_path / "report" / "report.md").read_text()
    assert 'id="selection"' in index.read_text()


class CrashingPolicy(ScriptedPolicy):
    """The scripted policy, interrupted (as by preemption) once `crash_after` requests of one
    task have been answered in MCTS."""

    def __init__(self, tasks: Sequence[Task], plans: dict[str, str], crash_on: str) -> None:
        super().__init__(tasks, plans)
        self.crash_on = crash_on

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        for request in requests:
            if request.stop != "score" and self.task_of(request).task_id == self.crash_on:
                raise KeyboardInterrupt("preempted")
        return super().generate(requests)


def test_an_interrupted_evaluation_resumes_without_searching_finished_tasks_again(
    test_tasks, tmp_path
) -> None:
    tasks = read_jsonl(test_tasks, Task)[:3]
    plans = {tasks[0].task_id: "fix", tasks[1].task_id: "late", tasks[2].task_id: "never"}
    config = load_config(
        overrides={
            "search": {"rollouts": 2, "rewrites_per_expansion": 1, "parallel_trees": 1},
            "evaluate": {"max_tasks": 3, "rollout_ablation": [1, 2], "modes": ["mcts"]},
            "sandbox": {"backend": "subprocess", "workers": 1},
        }
    )
    crashing = CrashingPolicy(tasks, plans, crash_on=tasks[2].task_id)
    with pytest.raises(KeyboardInterrupt):
        evaluate(test_tasks, tmp_path / "eval", config, engine=crashing)
    partial = tmp_path / "eval" / "trajectories-mcts.partial.jsonl"
    finished = [json.loads(line)["task_id"] for line in partial.read_text().splitlines()]
    assert finished == [tasks[0].task_id, tasks[1].task_id]
    with partial.open("a") as handle:  # the crash also cut a record short
        handle.write('{"task_id": "cut sh')

    resumed = ScriptedPolicy(tasks, plans)
    results = evaluate(test_tasks, tmp_path / "eval", config, engine=resumed)
    assert set(resumed.calls) == {tasks[2].task_id}, "finished tasks were searched again"
    fresh = evaluate(test_tasks, tmp_path / "fresh", config, engine=ScriptedPolicy(tasks, plans))
    assert results.modes["mcts"].per_task == fresh.modes["mcts"].per_task
    assert results.mcts_rollout_ablation["1"].per_task == fresh.mcts_rollout_ablation["1"].per_task

    other = config.model_copy(update={"search": config.search.model_copy(update={"rollouts": 1})})
    again = ScriptedPolicy(tasks, plans)
    evaluate(test_tasks, tmp_path / "eval", other, engine=again)
    assert set(again.calls) == {t.task_id for t in tasks}, "other settings must search anew"


def test_evaluate_with_the_real_engine_and_the_tiny_model(test_tasks, tiny_model_dir, tmp_path):
    """The real generation engine (a tiny random Llama) through every evaluation mode: each mode
    searches with its own search mode, rewarded by the visible tests only, and sized for the
    largest budget it reads."""
    tasks = read_jsonl(test_tasks, Task)[:2]
    config = load_config(
        overrides={
            "policy": {
                "model": str(tiny_model_dir),
                "max_new_tokens": 16,
                "critique_max_new_tokens": 8,
                "cpu_threads": 1,
            },
            "search": {"rollouts": 2, "rewrites_per_expansion": 1, "bon_samples": 2},
            "evaluate": {"max_tasks": 2, "rollout_ablation": [1, 2]},
            "sandbox": {"backend": "subprocess", "workers": 1},
        }
    )
    results = evaluate(test_tasks, tmp_path, config)
    assert list(results.modes) == ["zero_shot", "full_rewrite", "mcts", "bon"]
    for mode in results.modes:
        trajectories = read_jsonl(tmp_path / f"trajectories-{mode}.jsonl", Trajectory)
        assert [t.task_id for t in trajectories] == [t.task_id for t in tasks]
        for trajectory, task in zip(trajectories, tasks, strict=True):
            assert trajectory.mode == mode and trajectory.reward_tests == "visible"
            assert trajectory.nodes[0].verdict.n_total == len(task.tests("visible"))
            rewrites = len(trajectory.nodes) - 1
            assert rewrites == {"zero_shot": 1, "full_rewrite": 1, "bon": 2}.get(mode, rewrites)
            assert trajectory.completion_tokens > 0
    assert results.modes["bon"].samples == 2
    assert set(results.mcts_rollout_ablation) == {"1", "2"}


class SamplingPolicy(ScriptedPolicy):
    """Greedy answers as scripted; of the n answers of a sampled request (temperature > 0) the
    first `good[task]` fix the task and the others are wrong."""

    def __init__(self, tasks: Sequence[Task], plans: dict[str, str], good: dict[str, int]):
        super().__init__(tasks, plans)
        self.good = good
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        self.requests += requests
        results = super().generate(requests)
        for index, request in enumerate(requests):
            if request.temperature > 0 and request.stop != "score":
                task = self.task_of(request)
                texts = [
                    f"```python\n{task.oracle_code}\n```"
                    if i < self.good[task.task_id]
                    else f"```python\n{task.buggy_code}\n{WRONG_MARKER} = {i}\n```"
                    for i in range(request.n)
                ]
                results[index] = GenerationResult(
                    texts=texts, prompt_tokens=1, completion_tokens=[1] * request.n
                )
        return results


def test_a_single_answer_mode_samples_answers_beside_its_greedy_one(test_tasks, tmp_path) -> None:
    """promotion.samples: k answers to the greedy answer's own prompt, sampled at the search
    temperature in one request, each scored on all tests and counted per task; the greedy
    answer is scored as before; the sampled trees resume like a mode's, and another k samples
    afresh."""
    from codeq.errors import ConfigError
    from codeq.evaluate.results import EvalResults

    tasks = read_jsonl(test_tasks, Task)[:3]
    first, second, third = (task.task_id for task in tasks)
    plans = {first: "fix", second: "never", third: "never"}
    good = {first: 1, second: 3, third: 0}
    config = load_config(
        overrides={
            "search": {"temperature": 0.7, "top_p": 0.9},
            "evaluate": {"max_tasks": 3, "modes": ["zero_shot", "full_rewrite"]},
            "sandbox": {"backend": "subprocess", "workers": 2},
        }
    )

    def run(samples: dict[str, int], out: str = "eval") -> tuple[EvalResults, SamplingPolicy]:
        policy = SamplingPolicy(tasks, plans, good)
        evaluation = evaluate(test_tasks, tmp_path / out, config, engine=policy, samples=samples)
        return evaluation, policy

    results, policy = run({"full_rewrite": 4})
    greedy = results.modes["full_rewrite"]
    assert greedy.per_task == {first: True, second: False, third: False}
    assert greedy.sampled is not None and results.modes["zero_shot"].sampled is None
    assert greedy.sampled.per_task == {first: 1, second: 3, third: 0}
    assert (greedy.sampled.samples, greedy.sampled.temperature, greedy.sampled.top_p) == (
        4,
        0.7,
        0.9,
    )
    assert greedy.sampled.pass_rate == pytest.approx(4 / 12)
    sampled_requests = [r for r in policy.requests if r.temperature > 0]
    assert [(r.n, r.temperature, r.top_p) for r in sampled_requests] == [(4, 0.7, 0.9)] * 3
    assert len({r.seed for r in sampled_requests}) == 3, "each task's samples have their own seed"
    sampled_trees = read_jsonl(
        tmp_path / "eval/trajectories-full_rewrite-samples.jsonl", Trajectory
    )
    greedy_trees = read_jsonl(tmp_path / "eval/trajectories-full_rewrite.jsonl", Trajectory)
    for sampled_tree, greedy_tree in zip(sampled_trees, greedy_trees, strict=True):
        assert len(sampled_tree.nodes) == 5
        assert sampled_tree.nodes[1].prompt == greedy_tree.nodes[1].prompt
    assert EvalResults.load(tmp_path / "eval") == results

    resumed, again = run({"full_rewrite": 4})
    assert not again.requests, "the finished evaluation was searched again"
    assert resumed.modes["full_rewrite"].sampled == greedy.sampled
    fewer, other = run({"full_rewrite": 2})
    assert [r.n for r in other.requests if r.temperature > 0] == [2] * 3
    assert fewer.modes["full_rewrite"].sampled.per_task == {first: 1, second: 2, third: 0}
    with pytest.raises(ConfigError, match="cannot sample answers in 'mcts'"):
        run({"mcts": 2}, "mcts")


@pytest.mark.parametrize(("prompt", "asked_once"), [("plain", True), ("detailed", False)])
def test_the_two_single_passes_are_generated_once_when_they_ask_the_same(
    test_tasks, tmp_path, prompt, asked_once
) -> None:
    """Under search.prompt 'plain' full_rewrite sends zero_shot's greedy request: its answers are
    zero_shot's trees under its own name, not written again; under 'detailed' both are asked."""
    tasks = read_jsonl(test_tasks, Task)[:3]
    plans = {tasks[0].task_id: "fix", tasks[1].task_id: "never", tasks[2].task_id: "fix"}
    config = load_config(
        overrides={
            "search": {"prompt": prompt},
            "evaluate": {"max_tasks": 3, "modes": ["zero_shot", "full_rewrite"]},
            "sandbox": {"backend": "subprocess", "workers": 2},
        }
    )
    policy = ScriptedPolicy(tasks, plans)
    results = evaluate(test_tasks, tmp_path, config, engine=policy)

    assert sum(policy.calls.values()) == (3 if asked_once else 6)
    zero_shot, full_rewrite = results.modes["zero_shot"], results.modes["full_rewrite"]
    assert zero_shot.per_task == full_rewrite.per_task
    assert zero_shot.solved == full_rewrite.solved == 2
    trees = read_jsonl(tmp_path / "trajectories-full_rewrite.jsonl", Trajectory)
    assert {tree.mode for tree in trees} == {"full_rewrite"}
    assert full_rewrite.completion_tokens == zero_shot.completion_tokens == 3
