"""Search end to end: real tasks built by `codeq prepare`, the real sandbox (gVisor here), the
tiny random Llama (fast) and, marked slow, the real SmolLM2-135M; plus `codeq collect`."""

from __future__ import annotations

from pathlib import Path

import pytest

from codeq import cli
from codeq.config import load_config
from codeq.policy import PolicyEngine
from codeq.policy.critique import parse_score
from codeq.schemas import Task, Trajectory, read_jsonl
from codeq.search import collect, run_search


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory) -> Path:
    """Builtin tasks prepared for real: oracle-checked visible and hidden tests."""
    out = tmp_path_factory.mktemp("tasks")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(out)]) == 0
    return out / "train.jsonl"


@pytest.fixture(scope="module")
def sandbox():
    from codeq.sandbox import Sandbox

    with Sandbox(load_config().sandbox) as box:
        yield box


def small_config(model: str, **search):
    return load_config(
        None,
        {
            "policy": {
                "model": model,
                "max_new_tokens": 24,
                "critique_max_new_tokens": 8,
                "cpu_threads": 1,
            },
            "search": {"rewrites_per_expansion": 2, "rollouts": 2, "parallel_trees": 3, **search},
        },
    )


def check_trajectory(trajectory: Trajectory, task: Task, rollouts: int, k: int) -> None:
    assert trajectory.task_id == task.task_id and trajectory.model
    nodes = trajectory.nodes
    assert nodes[0].program == task.buggy_code and nodes[0].verdict is not None
    assert len(nodes) == 1 + rollouts * k  # tiny model never passes, so every rollout runs
    for node in nodes[1:]:
        assert node.prompt and node.prompt[-1].role == "user"
        assert node.parent is not None and node.depth == nodes[node.parent].depth + 1
        assert 1 <= node.rollout <= rollouts
        assert (node.verdict is not None) == node.valid
        assert node.q_mcts == pytest.approx(node.value_sum / node.visits)
        if node.valid:
            assert node.q_ai is not None and 0.0 <= node.q_ai <= 1.0
    assert nodes[0].visits == 1 + rollouts * k
    assert trajectory.completion_tokens > 0 and trajectory.prompt_tokens > 0
    hidden = {repr(t.call) for t in task.hidden_tests}
    for node in nodes[1:]:
        text = "".join(m.content for m in node.prompt)
        assert not any(call in text for call in hidden)


def test_tiny_model_mcts_with_the_real_sandbox(tiny_model_dir, tasks_file, sandbox):
    tasks = read_jsonl(tasks_file, Task)[:4]
    config = small_config(str(tiny_model_dir))
    engine = PolicyEngine.load(config.policy, seed=0)
    seen: list[str] = []
    trajectories = run_search(
        tasks, engine, sandbox, config, on_trajectory=lambda t: seen.append(t.task_id)
    )
    assert [t.task_id for t in trajectories] == [t.task_id for t in tasks]
    assert sorted(seen) == sorted(t.task_id for t in tasks)
    for trajectory, task in zip(trajectories, tasks, strict=True):
        check_trajectory(trajectory, task, rollouts=2, k=2)
        assert trajectory.reward_tests == "all"
        assert trajectory.nodes[0].verdict.n_total == len(task.tests("all"))


def test_collect_shards_resumes_and_never_duplicates(tiny_model_dir, tasks_file, tmp_path):
    config = small_config(str(tiny_model_dir), rollouts=1)
    engine = PolicyEngine.load(config.policy, seed=0)
    out = tmp_path / "traj.jsonl"
    first = collect(
        tasks_file,
        out,
        config.derive(search={"max_tasks": 2}),
        shard_index=1,
        shard_count=4,
        engine=engine,
    )
    assert first["searched"] == 2 and first["skipped"] == 0
    with out.open("a") as handle:  # a kill in the middle of a write leaves a torn line
        handle.write('{"task_id": "torn')
    again = collect(tasks_file, out, config, shard_index=1, shard_count=4, engine=engine)
    all_tasks = read_jsonl(tasks_file, Task)
    shard = [t.task_id for i, t in enumerate(all_tasks) if i % 4 == 1]
    assert again["skipped"] == 2 and again["searched"] == len(shard) - 2
    ids = [t.task_id for t in read_jsonl(out, Trajectory)]
    assert sorted(ids) == sorted(shard) and len(set(ids)) == len(ids)


def test_collect_cli_writes_trajectories_and_a_summary(
    tiny_model_dir, tasks_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("CODEQ_POLICY__MAX_NEW_TOKENS", "24")
    monkeypatch.setenv("CODEQ_POLICY__CRITIQUE_MAX_NEW_TOKENS", "8")
    monkeypatch.setenv("CODEQ_POLICY__CPU_THREADS", "1")
    out = tmp_path / "cli"
    argv = ["collect", str(tasks_file), "--out", str(out), "--model", str(tiny_model_dir)]
    argv += ["--mode", "bon", "--rollouts", "2", "--max-tasks", "2"]
    code = cli.run(argv)
    assert code == 0
    assert "2 task(s) searched" in capsys.readouterr().out
    trajectories = read_jsonl(out / "trajectories.jsonl", Trajectory)
    assert [t.mode for t in trajectories] == ["bon", "bon"]
    assert all(len(t.nodes) == 3 for t in trajectories)


def test_collect_cli_rejects_a_bad_shard(tasks_file, tmp_path):
    argv = ["collect", str(tasks_file), "--out", str(tmp_path / "x")]
    assert cli.run([*argv, "--shard-index", "3", "--shard-count", "2"]) == 2


@pytest.mark.slow
def test_smollm2_searches_real_tasks(smollm2_dir, tasks_file, sandbox):
    tasks = read_jsonl(tasks_file, Task)[:3]
    config = load_config(
        None,
        {
            "policy": {
                "model": str(smollm2_dir),
                "max_new_tokens": 160,
                "cpu_threads": 1,
                "dtype": "float32",
            },
            "search": {"rewrites_per_expansion": 2, "rollouts": 1, "parallel_trees": 3},
        },
    )
    engine = PolicyEngine.load(config.policy, seed=0)
    trajectories = run_search(
        tasks, engine, sandbox, config.derive(search={"reward_tests": "visible"})
    )
    rewrites = [n for t in trajectories for n in t.nodes[1:]]
    assert len(rewrites) == 6
    # a real instruction model answers with code: most rewrites are fenced and extractable
    assert sum("```" in n.completion for n in rewrites) >= 4
    assert sum(n.valid for n in rewrites) >= 3
    for trajectory, task in zip(trajectories, tasks, strict=True):
        assert trajectory.reward_tests == "visible"
        for node in trajectory.nodes[1:]:
            if node.valid:
                assert node.verdict.n_total == len(task.visible_tests)
                assert node.critique.startswith("Score: ") and 0.0 <= node.q_ai <= 1.0
    critiqued = [n for n in rewrites if n.valid]
    # with the answer prefilled, SmolLM2 writes a number: most critiques parse to a real score
    assert sum(parse_score(n.critique) is not None for n in critiqued) >= len(critiqued) // 2
