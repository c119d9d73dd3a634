"""The collect job killed (SIGKILL) mid-way and restarted ends with every task exactly once,
on a real S3 endpoint with injected 5xx answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_store_helpers import BUCKET, S3_ENV, s3_endpoint_fixture  # noqa: F401

from codeq.config import StoreConfig, load_config
from codeq.pipeline.stages import StageContext, prepare_stage
from codeq.schemas import Trajectory, read_jsonl
from codeq.store import RoundLayout, open_store

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN = "killtest"
SHARDS = 3  # shard 0 of 3 holds every third train task (enough to kill mid-way, and quick)


def tiny_collect_env(model_dir: Path, uri: str, endpoint: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CODEQ_") and not key.startswith("JOB_COMPLETION")
    }
    env.update(S3_ENV)
    env.update(
        {
            "CODEQ_STORE__URI": uri,
            "CODEQ_STORE__ENDPOINT_URL": endpoint,
            "CODEQ_STORE__RUN": RUN,
            "CODEQ_STORE__ROUND": "0",
            "CODEQ_STORE__MAX_ATTEMPTS": "6",
            "CODEQ_POLICY__MODEL": str(model_dir),
            "CODEQ_POLICY__MAX_NEW_TOKENS": "24",
            "CODEQ_POLICY__CRITIQUE_MAX_NEW_TOKENS": "8",
            "CODEQ_POLICY__DEVICE": "cpu",
            "CODEQ_SEARCH__ROLLOUTS": "1",
            "CODEQ_SEARCH__REWRITES_PER_EXPANSION": "2",
            "CODEQ_SEARCH__PARALLEL_TREES": "1",
            "CODEQ_SANDBOX__WORKERS": "1",
            "JOB_COMPLETION_INDEX": "0",
            "JOB_COMPLETION_COUNT": str(SHARDS),
        }
    )
    return env


def start_collect(env: dict[str, str], log_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.collect"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("w"),
    )


@pytest.mark.slow
def test_collect_killed_midway_resumes_with_every_task_once(s3_endpoint, tiny_model_dir, tmp_path):
    uri = f"s3://{BUCKET}/kill-{int(time.time())}"
    store = open_store(
        StoreConfig(uri=uri, endpoint_url=s3_endpoint.url, region="us-east-1", run=RUN)
    )
    config = load_config(None, {"store": {"uri": uri, "endpoint_url": s3_endpoint.url, "run": RUN}})
    prepare_stage(StageContext(config, store, tmp_path / "prepare"), "builtin")
    layout = RoundLayout(RUN, 0)
    train_ids = [
        json.loads(line)["task_id"]
        for line in store.get_bytes(layout.stage("tasks") + "/train.jsonl").decode().splitlines()
        if line.strip()
    ][0::SHARDS]
    assert len(train_ids) >= 3

    env = tiny_collect_env(tiny_model_dir, uri, s3_endpoint.proxy.url)
    first = start_collect(env, tmp_path / "first.log")
    task_prefix = layout.shard(0) + "/tasks"
    deadline = time.monotonic() + 240
    try:
        while not store.list(task_prefix):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no task finished in time"
            time.sleep(0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    before = {key: store.get_bytes(key) for key in store.list(task_prefix)}
    done_before = len(before)
    assert 1 <= done_before < len(train_ids), "the kill must land mid-way"
    assert not store.is_complete(layout.shard(0))

    s3_endpoint.proxy.fail_next(4, status=503)  # the restart also rides out S3 5xx answers
    second = start_collect(env, tmp_path / "second.log")
    assert second.wait(timeout=400) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    assert f"{done_before} task(s) restored from the store" in log

    assert store.is_complete(layout.shard(0))
    final_dir = tmp_path / "final"
    store.get_dir(layout.shard(0), final_dir)
    trajectories = read_jsonl(final_dir / "trajectories.jsonl", Trajectory)
    ids = [trajectory.task_id for trajectory in trajectories]
    assert sorted(ids) == sorted(train_ids)  # every task, exactly once
    objects = store.list(task_prefix)
    assert sorted(Path(key).stem for key in objects) == sorted(train_ids)
    for key, data in before.items():  # restored tasks were skipped, not searched again
        assert store.get_bytes(key) == data
