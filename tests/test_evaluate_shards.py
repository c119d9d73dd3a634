"""Evaluate as an Indexed Job: shards that evaluate whole search groups of each split, merged by
the last one to finish into the eval/ output one process writes (codeq/evaluate/shards.py,
evaluate_stage in codeq/pipeline/stages.py). The round up to its adapter is real (the tiny model,
a real DPO step, the real sandbox); the incumbent answers through a stand-in that solves some
tasks, so the merged rates, breakdowns and sampled pass counts are not all zeros."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from preemption import Preempted
from test_round import TINY_SETTINGS, OracleOrWrongPolicy

from codeq.config import CodeQConfig, load_config
from codeq.errors import CorruptInputError, MissingInputError
from codeq.evaluate.results import EvalResults
from codeq.evaluate.shards import merge_results
from codeq.evaluate.stats import summarize
from codeq.pipeline.local_round import LOCAL_ROUND_PRESET
from codeq.pipeline.policies import current_policy
from codeq.pipeline.stages import (
    StageContext,
    collect_stage,
    eval_shard_prefix,
    evaluate_stage,
    merge_eval_shards,
    pairs_stage,
    prepare_stage,
    promote_stage,
    stage_rows,
    train_stage,
)
from codeq.schemas import Task, read_jsonl
from codeq.store import MARKER_NAME, ArtifactStore, RoundLayout, join_key, open_store

RUN = "shards"
LAYOUT = RoundLayout(RUN, 0)
SETTINGS: dict[str, Any] = {
    **TINY_SETTINGS,
    "tasks": {"max_items": 16, "train_per_round": 3},
    # groups of 2: with 2 shards, shard 0 takes tasks 0-1 of each split, shard 1 tasks 2-3
    # the detailed first turn: the zero_shot guard then asks another prompt than full_rewrite
    "search": {
        **TINY_SETTINGS["search"],
        "parallel_trees": 2,
        "bon_samples": 2,
        "prompt": "detailed",
    },
    "evaluate": {"modes": ["zero_shot", "mcts", "bon"], "rollout_ablation": [1], "max_tasks": 4},
    "promotion": {
        "modes": ["full_rewrite"],
        "guard_modes": ["zero_shot"],
        "samples": 2,
        "max_tasks": 4,
    },
}


class SomeOraclePolicy(OracleOrWrongPolicy):
    """A stand-in incumbent whose answers pass on some tasks only: answer i of task number t
    (in `tasks`' order) is the task's oracle program when t + i is even, a wrong rewrite
    otherwise; critiques say 5/10. Deterministic whatever the batches."""

    name = "some-oracle"

    def samples(self, request):
        task = self.task_of(request)
        number = self.tasks.index(task)
        wrong = task.buggy_code + "\nWRONG_REWRITE = 1\n"
        return [task.oracle_code if (number + i) % 2 == 0 else wrong for i in range(request.n)]


@pytest.fixture(scope="module")
def trained_round(tmp_path_factory, tiny_model_dir) -> tuple[CodeQConfig, Path]:
    """A store holding round 0 up to its adapter: prepare, collect (oracle-or-wrong stand-in),
    pairs and one DPO step on the tiny model."""
    root = tmp_path_factory.mktemp("eval-shards")
    config = load_config(
        LOCAL_ROUND_PRESET,
        {
            **SETTINGS,
            "policy": {
                **SETTINGS["policy"],
                "model": str(tiny_model_dir),
                "cache_dir": str(root / "cache"),
            },
            "store": {"uri": f"file://{root / 'store'}", "run": RUN},
        },
    )
    ctx = StageContext(config, open_store(config.store), root / "work")
    prepare_stage(ctx, "builtin")
    train_tasks = read_jsonl(root / "work/round-0/tasks/train.jsonl", Task)
    ctx.engines["collect"] = OracleOrWrongPolicy(train_tasks)
    collect_stage(ctx)
    pairs_stage(ctx)
    train_stage(ctx)
    assert ctx.store.marker(LAYOUT.stage("adapter"))["trained"] is True
    return config, root


def copy_of(trained: tuple[CodeQConfig, Path], name: str) -> tuple[CodeQConfig, ArtifactStore]:
    """A copy of the trained store, and the config that points at it."""
    config, root = trained
    shutil.copytree(root / "store", root / name)
    store_config = config.store.model_copy(update={"uri": f"file://{root / name}"})
    copied = config.model_copy(update={"store": store_config})
    return copied, open_store(copied.store)


def stand_in_engines(config: CodeQConfig, store: ArtifactStore, scratch: Path) -> dict[str, Any]:
    """The incumbent (the base model) answers through SomeOraclePolicy on every eval task; the
    candidate (base + adapter) is the tiny model itself."""
    ctx = StageContext(config, store, scratch)
    tasks_dir = scratch / "tasks"
    store.get_dir(LAYOUT.stage("tasks"), tasks_dir)
    tasks = [
        t
        for split in ("validation", "test")
        for t in read_jsonl(tasks_dir / f"{split}.jsonl", Task)
    ]
    return {current_policy(ctx).id: SomeOraclePolicy(tasks)}


def without_seconds(value: Any) -> Any:
    """Wall times differ from run to run; everything else must not."""
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [without_seconds(v) for v in value]
    return value


def eval_output(store: ArtifactStore, prefix: str) -> dict[str, str]:
    """Every file of a stage output (its manifest and marker aside), parsed, wall times left out,
    and dumped again in its own key order (so a reordered key or line is a difference). Resume
    files list trees in the order they finished: compared by task."""
    out: dict[str, str] = {}
    for key in store.list(prefix):
        relative = key.removeprefix(prefix + "/")
        if relative in ("MANIFEST.json", MARKER_NAME):
            continue
        text = store.get_bytes(key).decode()
        if relative.endswith(".jsonl"):
            rows = [without_seconds(json.loads(line)) for line in text.splitlines()]
            if relative.endswith(".partial.jsonl"):
                rows.sort(key=lambda row: row["task_id"])
            out[relative] = json.dumps(rows)
        else:
            out[relative] = json.dumps(without_seconds(json.loads(text)))
    return out


@pytest.fixture(scope="module")
def one_and_two_shards(trained_round):
    """The same evaluation as one process and as two shards (separate scratch folders, as two
    pods have), each followed by promote."""
    root = trained_round[1]
    outcome: dict[str, Any] = {}
    config, one = copy_of(trained_round, "one")
    engines = stand_in_engines(config, one, root / "one-tasks")
    outcome["one"] = evaluate_stage(StageContext(config, one, root / "one-work", engines=engines))
    promote_stage(StageContext(config, one, root / "one-promote"))

    config, two = copy_of(trained_round, "two")
    contexts = [
        StageContext(config, two, root / f"two-work-{index}", engines=engines) for index in (0, 1)
    ]
    outcome["shard 0"] = evaluate_stage(contexts[0], 0, 2)
    outcome["eval after shard 0"] = two.is_complete(LAYOUT.stage("eval"))
    outcome["shard 1"] = evaluate_stage(contexts[1], 1, 2)
    outcome["shard 0 again"] = evaluate_stage(contexts[0], 0, 2)
    promote_stage(StageContext(config, two, root / "two-promote"))
    outcome["rows"] = stage_rows(contexts[0])
    return one, two, outcome, config


@pytest.mark.slow
def test_two_shards_merge_into_what_one_process_writes(one_and_two_shards):
    one, two, outcome, _ = one_and_two_shards
    # shard 0 finished first: its part is stored and marked, nothing merged yet
    assert outcome["shard 0"]["merged"] is False and not outcome["eval after shard 0"]
    assert two.marker(eval_shard_prefix_of(0))["shard_count"] == 2
    # the last one merged: eval/ holds what one process writes, byte for byte but wall times
    assert two.marker(LAYOUT.stage("eval"))["shards"] == 2
    merged, single = eval_output(two, LAYOUT.stage("eval")), eval_output(one, LAYOUT.stage("eval"))
    assert sorted(merged) == sorted(single)
    for name in single:
        assert merged[name] == single[name], name
    for split in ("validation", "test"):
        assert f"candidate/{split}/results.json" in single
    # each shard evaluated its own whole groups of 2 validation and test tasks
    for split in ("validation", "test"):
        ids = json.loads(single[f"incumbent/{split}/results.json"])["task_ids"]
        assert len(ids) >= 3, "both shards need tasks"
        for index, wanted in ((0, ids[:2]), (1, ids[2:4])):
            key = join_key(eval_shard_prefix_of(index), f"incumbent/{split}/results.json")
            assert json.loads(two.get_bytes(key))["task_ids"] == wanted
    # not a comparison of zeros: the incumbent solves some tasks and not others
    incumbent = json.loads(single["incumbent/test/results.json"])
    assert 0 < incumbent["modes"]["zero_shot"]["solved"] < incumbent["modes"]["zero_shot"]["n"]
    sampled = json.loads(single["incumbent/validation/results.json"])["modes"]["full_rewrite"]
    assert 0 < sum(sampled["sampled"]["per_task"].values()) < 2 * sampled["n"]
    # promote read the merged results and decided as it did on one process's
    assert eval_output(two, LAYOUT.stage("promote")) == eval_output(one, LAYOUT.stage("promote"))
    # a shard that is complete is not evaluated again (the pod of a retried index); the
    # report lists each shard's wall time
    assert outcome["shard 0 again"]["skipped"] is True
    stages = [row["stage"] for row in outcome["rows"]]
    assert {"evaluate shard-0", "evaluate shard-1", "evaluate"} <= set(stages)


def eval_shard_prefix_of(index: int) -> str:
    return join_key(LAYOUT.stage("eval-shards"), f"shard-{index}")


@pytest.mark.slow
def test_a_missing_shard_is_refused_by_the_merge(one_and_two_shards, tmp_path):
    _, two, _, config = one_and_two_shards
    root = Path(two.uri.removeprefix("file://"))
    shutil.copytree(root, tmp_path / "store")
    store_config = config.store.model_copy(update={"uri": f"file://{tmp_path / 'store'}"})
    copied = config.model_copy(update={"store": store_config})
    store = open_store(copied.store)
    ctx = StageContext(copied, store, tmp_path / "work")
    assert eval_shard_prefix(ctx, 1) == eval_shard_prefix_of(1)
    store.unmark_complete(LAYOUT.stage("eval"))
    store.delete_prefix(LAYOUT.stage("eval"))
    store.unmark_complete(eval_shard_prefix(ctx, 1))  # shard 1 preempted before its marker
    with pytest.raises(MissingInputError, match=r"shard\(s\) \[1\] of 2 .* are not complete"):
        merge_eval_shards(ctx, 2)
    # shards made for another count are not this evaluation's
    with pytest.raises(MissingInputError, match=r"shard\(s\) \[0, 1, 2\] of 3"):
        merge_eval_shards(ctx, 3)
    assert not store.is_complete(LAYOUT.stage("eval"))


@pytest.mark.slow
def test_a_stopped_evaluation_resumes_on_another_pod_from_the_trees_it_saved(
    one_and_two_shards, trained_round, monkeypatch
):
    """A pod stopped after three trees of its evaluation: the next pod (an empty scratch
    folder, as on another node) searches none of those three again and writes what one
    uninterrupted process wrote; the saved trees are spent once the evaluation is complete."""
    import codeq.pipeline.stages as stages

    one = one_and_two_shards[0]
    root = trained_round[1]
    config, store = copy_of(trained_round, "stopped")
    engines = stand_in_engines(config, store, root / "stopped-tasks")
    real_saver = stages._saved_trees
    saved_by: dict[str, list[tuple[str, str]]] = {"pod 1": [], "pod 2": []}

    def counting(pod: str, stop_after: int | None):
        def saver(ctx, prefix):
            save = real_saver(ctx, prefix)

            def save_and_count(searched):
                save(searched)
                saved_by[pod].append((prefix + "/" + searched.label, searched.trajectory.task_id))
                if len(saved_by[pod]) == stop_after:
                    raise Preempted

            return save_and_count

        return saver

    monkeypatch.setattr(stages, "_saved_trees", counting("pod 1", stop_after=3))
    with pytest.raises(Preempted):
        evaluate_stage(StageContext(config, store, root / "stopped-pod-1", engines=engines))
    progress = LAYOUT.stage(stages.EVAL_PROGRESS)
    assert len([key for key in store.list(progress) if "/trees/" in key]) == 3
    assert not store.is_complete(LAYOUT.stage("eval"))

    monkeypatch.setattr(stages, "_saved_trees", counting("pod 2", stop_after=None))
    evaluate_stage(StageContext(config, store, root / "stopped-pod-2", engines=engines))
    assert saved_by["pod 2"], "the second pod searched the rest"
    assert not set(saved_by["pod 1"]) & set(saved_by["pod 2"]), "saved trees searched again"
    stopped, single = (
        eval_output(store, LAYOUT.stage("eval")),
        eval_output(one, LAYOUT.stage("eval")),
    )
    assert sorted(stopped) == sorted(single)
    for name in single:
        assert stopped[name] == single[name], name
    assert not store.list(progress)


def test_merging_refuses_shards_that_do_not_split_the_tasks(tmp_path):
    tasks = [
        Task.model_construct(task_id=f"t{i}", level="easy", category="logic error", subtype="x")
        for i in range(3)
    ]

    def part(ids: list[str]) -> EvalResults:
        mine = [task for task in tasks if task.task_id in ids]
        solved = {task.task_id: True for task in mine}
        mode = {**summarize(mine, solved), "programs": 1.0}
        return EvalResults.model_validate(
            {
                "model": "m",
                "task_ids": ids,
                "primary_mode": "zero_shot",
                "confidence": 0.95,
                "modes": {"zero_shot": mode},
            }
        )

    merged = merge_results([part(["t0", "t1"]), part(["t2"])], tasks)
    assert merged.task_ids == ["t0", "t1", "t2"] and merged.primary().solved == 3
    with pytest.raises(CorruptInputError, match="1 missing"):
        merge_results([part(["t0", "t1"])], tasks)
    with pytest.raises(CorruptInputError, match="1 twice"):
        merge_results([part(["t0", "t1"]), part(["t1", "t2"])], tasks)
