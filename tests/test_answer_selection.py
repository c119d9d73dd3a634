"""bench/answer_selection.py on one real task's committed-style tree: each selector's answer
scored on all the task's tests, the comparisons and the declared rule's decision."""

from __future__ import annotations

import json
import lzma

from test_agreement import add_task, program, rewrites
from test_bench import load_bench

from codeq.config import SandboxConfig
from codeq.sandbox import Sandbox
from codeq.schemas import Node, Trajectory, write_jsonl

# All pass the visible test (add(1, 2) = 3); only the sums pass the hidden one (add(5, 7)).
# The critique likes the constant; the three programs that raise unless a == 1 are the
# largest behaviour on the probes, but the sums answer every probe.
RAISING = [
    "a + b if a == 1 else 1 // 0",
    "b + a if a == 1 else 1 // 0",
    "(a + b) if a == 1 else 1 // 0",
]
REWRITES = [("3", 0.9), ("a + b", 0.1), ("b + a", 0.1), *[(e, 0.5) for e in RAISING]]
VERIFIER = {"3": 0.2, "a + b": 0.8, "b + a": 0.7, **{e: 0.3 for e in RAISING}}


def committed_tree(task) -> Trajectory:
    with Sandbox(SandboxConfig(backend="subprocess", workers=1)) as sandbox:
        nodes = rewrites(task, [expression for expression, _ in REWRITES], sandbox)
    for node, (_, critique) in zip(nodes, REWRITES, strict=True):
        node.q_ai = critique
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    return Trajectory(
        **task.model_dump(include={"task_id", "slug", "level", "category", "subtype"}),
        mode="bon",
        reward_tests="visible",
        nodes=[root, *nodes],
        solved=True,
        final_node=1,
    )


def test_answer_selection_scores_every_selector_and_applies_the_declared_rules(tmp_path, capsys):
    bench = load_bench("answer_selection")
    kept_score_key = load_bench("verifier_auc").kept_score_key
    task = add_task()
    tasks = tmp_path / "store" / "runs" / "curve" / "round-0" / "tasks" / "validation.jsonl"
    tasks.parent.mkdir(parents=True)
    write_jsonl(tasks, [task])
    trees = tmp_path / "trees"
    trees.mkdir()
    write_jsonl(trees / "trajectories-bon.jsonl", [committed_tree(task)])
    scores = tmp_path / "scores.jsonl.xz"
    lines = "".join(
        json.dumps({"key": kept_score_key(task, program(e)), "score": s}) + "\n"
        for e, s in VERIFIER.items()
    )
    scores.write_bytes(lzma.compress(lines.encode()))
    out = tmp_path / "selection.json"
    argv = ["--store", str(tmp_path / "store"), "--run", "curve", "--trees", str(trees)]
    argv += ["--scores", str(scores), "--probes", "6", "--workers", "1", "--json", str(out)]
    argv += ["--explain"]

    assert bench.main(argv) == 0
    explained = capsys.readouterr().out
    assert "bon add0 (add-two-integers), lost by critique, agreement+critique" in explained
    assert "2 sample(s), passes all tests: True, tie-break score 0.800" not in explained
    assert "1 sample(s), passes all tests: True, tie-break score 0.800" in explained  # a + b

    record = json.loads(out.read_text())
    bon = record["forests"]["bon"]
    assert (bon["trees"], bon["tied_tasks"], bon["solvable"]) == (1, 1, 1)
    assert bon["verifier_scores"] and bon["probed_tasks"] == 1
    solved = {name: row["solved"] for name, row in bon["selectors"].items()}
    assert solved == {
        "critique": 0,
        "agreement+critique": 0,  # the raising programs outvote the sums
        "answered+critique": 1,
        "answered+nearest+critique": 1,  # the sums' group, then a + b: nearest a - b
        "verifier": 1,
        "agreement+verifier": 0,
        "answered+verifier": 1,
        "answered+nearest+verifier": 1,
    }
    assert bon["selectors"]["agreement+verifier"]["lost_tasks"] == ["add0"]
    comparisons = {(c["baseline"], c["other"]): c for c in bon["comparisons"]}
    assert comparisons[("verifier", "agreement+verifier")]["lost_tasks"] == ["add0"]
    assert comparisons[("agreement+verifier", "answered+verifier")]["gained_tasks"] == ["add0"]
    # each declared rule: agreement only where it gains over the verifier alone; answered
    # probes first where it gains over agreement and loses nothing on the other forests
    assert record["decision"]["adopt"] is False
    assert record["answered_decision"]["adopt"] is True
    # the nearest rewrite first: no task gained over answered then verifier, so not adopted
    nearest = record["nearest_decision"]
    assert (nearest["adopt"], nearest["gained"], nearest["lost"]) == (False, 0, 0)


def test_more_probes_are_paired_per_task_against_a_baseline_run_and_decide_by_the_third_rule(
    tmp_path,
):
    """At 1 probe the sums and two programs wrong elsewhere answer alike, and the verifier
    picks a wrong one; at 6 the wrong ones part (each on its own probe) and the sums' group of
    two is answered: the 6-probe run, paired against the 1-probe run, gains the task."""
    from codeq.tasks.probes import probe_calls

    bench = load_bench("answer_selection")
    kept_score_key = load_bench("verifier_auc").kept_score_key
    task = add_task()
    calls = probe_calls(task, 6, seed=0)
    assert probe_calls(task, 1, seed=0) == calls[:1]  # more probes extend the same inputs
    assert [5, 7] not in [call["args"] for call in calls[:3]]
    wrong = [f"(0 if [a, b] in ({calls[k]['args']}, [5, 7]) else a + b)" for k in (1, 2)]
    expressions = ["a + b", "b + a", *wrong]
    verifier = {"a + b": 0.5, "b + a": 0.4, wrong[0]: 0.9, wrong[1]: 0.8}
    tasks = tmp_path / "store" / "runs" / "curve" / "round-0" / "tasks" / "validation.jsonl"
    tasks.parent.mkdir(parents=True)
    write_jsonl(tasks, [task])
    with Sandbox(SandboxConfig(backend="subprocess", workers=1)) as sandbox:
        nodes = rewrites(task, expressions, sandbox)
    assert all(node.verdict.passed for node in nodes)  # all tied on the visible test
    root = Node(id=0, parent=None, depth=0, program=task.buggy_code)
    tree = Trajectory(
        **task.model_dump(include={"task_id", "slug", "level", "category", "subtype"}),
        mode="bon",
        reward_tests="visible",
        nodes=[root, *nodes],
        solved=True,
        final_node=1,
    )
    trees = tmp_path / "trees"
    trees.mkdir()
    write_jsonl(trees / "trajectories-bon.jsonl", [tree])
    scores = tmp_path / "scores.jsonl.xz"
    lines = "".join(
        json.dumps({"key": kept_score_key(task, program(e)), "score": s}) + "\n"
        for e, s in verifier.items()
    )
    scores.write_bytes(lzma.compress(lines.encode()))
    common = ["--store", str(tmp_path / "store"), "--run", "curve", "--trees", str(trees)]
    common += ["--scores", str(scores), "--workers", "1"]
    one, six = tmp_path / "one.json", tmp_path / "six.json"

    assert bench.main([*common, "--probes", "1", "--json", str(one)]) == 0
    assert bench.main([*common, "--probes", "6", "--baseline", str(one), "--json", str(six)]) == 0

    assert (
        json.loads(one.read_text())["forests"]["bon"]["selectors"]["answered+verifier"]["solved"]
        == 0
    )
    record = json.loads(six.read_text())
    comparisons = {(c["baseline"], c["other"]): c for c in record["forests"]["bon"]["comparisons"]}
    assert set(comparisons) == {
        ("answered+verifier@1", "answered+verifier@6"),
        ("answered+critique@1", "answered+critique@6"),
    }
    assert comparisons[("answered+verifier@1", "answered+verifier@6")]["gained_tasks"] == ["add0"]
    assert record["decision"] is None and record["answered_decision"] is None
    decided = record["probes_decision"]
    assert (decided["adopt"], decided["probes"], decided["gained"], decided["lost"]) == (
        True,
        6,
        1,
        0,
    )
