"""The same config gives the same search, and every mode runs whatever its samples are against
the batch size: the real engine (the tiny random Llama), the real sandbox, builtin tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from codeq import cli
from codeq.config import PolicyConfig, load_config
from codeq.policy import GenerationRequest, PolicyEngine
from codeq.schemas import ChatMessage, Task, read_jsonl
from codeq.search import run_search

BATCH = 4


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> PolicyEngine:
    config = PolicyConfig(model=str(tiny_model_dir), dtype="float32", batch_size=BATCH)
    return PolicyEngine.load(config, seed=0)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[Task]:
    out = tmp_path_factory.mktemp("tasks")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(out)]) == 0
    return read_jsonl(Path(out) / "train.jsonl", Task)[:2]


@pytest.fixture(scope="module")
def sandbox():
    from codeq.sandbox import Sandbox

    with Sandbox(load_config(None, {"sandbox": {"workers": 2}}).sandbox) as box:
        yield box


def config(**search):
    return load_config(
        None,
        {
            "policy": {"max_new_tokens": 16, "critique_max_new_tokens": 8, "batch_size": BATCH},
            "search": {"rollouts": 2, "rewrites_per_expansion": 2, "parallel_trees": 2, **search},
        },
    )


def completions(trajectories) -> list[list[str]]:
    return [[node.completion for node in t.nodes] for t in trajectories]


def test_seeded_requests_repeat_and_differ_by_seed(engine):
    def request(seed: int) -> GenerationRequest:
        messages = [ChatMessage(role="user", content="Write a function.")]
        return GenerationRequest(messages, n=3, temperature=1.0, max_new_tokens=8, seed=seed)

    engine.clear_prefix_cache()
    first = engine.generate([request(1)])[0].texts
    engine.clear_prefix_cache()
    again = engine.generate([request(1)])[0].texts
    engine.clear_prefix_cache()
    other = engine.generate([request(2)])[0].texts
    assert first == again
    assert len(set(first)) > 1  # each sample has its own stream
    assert other != first


def test_the_same_config_gives_the_same_search(engine, tasks, sandbox):
    settings = config(temperature=1.0)
    first = run_search(tasks, engine, sandbox, settings)
    second = run_search(tasks, engine, sandbox, settings)
    assert completions(first) == completions(second)
    assert [t.final_node for t in first] == [t.final_node for t in second]
    reseeded = run_search(tasks, engine, sandbox, config(temperature=1.0, seed=7))
    assert completions(reseeded) != completions(first)


@pytest.mark.parametrize("samples", [BATCH - 1, BATCH, BATCH + 2])
@pytest.mark.parametrize("mode", ["mcts", "bon"])
def test_search_runs_with_samples_below_at_and_above_the_batch_size(
    engine, tasks, sandbox, mode, samples
):
    """Each tree asks for `samples` rewrites at once while other trees' rows are still
    decoding; a request that does not fit the free rows waits (it used to crash the stream)."""
    settings = config(rewrites_per_expansion=samples, bon_samples=samples, temperature=1.0)
    engine.stats.max_rows = 0
    trajectories = run_search(tasks, engine, sandbox, settings.derive(search={"mode": mode}))
    expected = samples * (2 if mode == "mcts" else 1)
    assert [len(t.nodes) - 1 for t in trajectories] == [expected] * len(tasks)
    assert engine.stats.max_rows <= max(BATCH, samples)


@pytest.mark.parametrize("mode", ["greedy", "plain"])
def test_single_rewrite_modes_run(engine, tasks, sandbox, mode):
    trajectories = run_search(tasks, engine, sandbox, config().derive(search={"mode": mode}))
    assert [len(t.nodes) for t in trajectories] == [2] * len(tasks)


class Stopped(Exception):
    """Stands for a kill of the collect process after some trees were written."""


def test_a_stopped_and_resumed_collection_writes_the_uninterrupted_trees(
    tiny_model_dir, sandbox, tmp_path
):
    """Five tasks in groups of two: the collection is stopped after its third tree (inside the
    second group), resumed, and must hold exactly the trees of an uninterrupted collection,
    each once: the unfinished group is searched whole again, not without its finished task.
    In bfloat16, as the curve runs, whose rounding depends on what shares the batch."""
    policy = PolicyConfig(model=str(tiny_model_dir), dtype="bfloat16", batch_size=BATCH)
    engine = PolicyEngine.load(policy, seed=0)
    from codeq.schemas import Trajectory
    from codeq.search.collect import collect

    tasks_file = tmp_path / "tasks.jsonl"
    prepared = tmp_path / "prepared"
    assert cli.run(["prepare", "--source", "builtin", "--out", str(prepared)]) == 0
    tasks_file.write_text("".join((prepared / "train.jsonl").read_text().splitlines(True)[:5]))
    settings = config(temperature=1.0)
    whole = tmp_path / "whole.jsonl"
    collect(tasks_file, whole, settings, engine=engine, scorer=None, progress=False)

    written = 0

    def stop_after_three(_: Trajectory) -> None:
        nonlocal written
        written += 1
        if written == 3:
            raise Stopped

    resumed = tmp_path / "resumed.jsonl"
    with pytest.raises(Stopped):
        collect(tasks_file, resumed, settings, engine=engine, on_trajectory=stop_after_three)
    assert len(read_jsonl(resumed, Trajectory)) == 3
    stats = collect(tasks_file, resumed, settings, engine=engine, progress=False)
    assert stats["skipped"] == 3 and stats["searched"] == 2

    def trees(path: Path) -> dict[str, list]:
        return {
            t.task_id: [
                (n.completion, n.program, n.critique, n.verdict and n.verdict.n_passed)
                for n in t.nodes
            ]
            for t in read_jsonl(path, Trajectory)
        }

    assert len(trees(whole)) == 5
    assert trees(resumed) == trees(whole)
