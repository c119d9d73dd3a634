"""Job entrypoints (`python -m jobs.<stage>`) on bad input: one clear `error:` line, the
documented exit code, and no completion marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_store_helpers import BUCKET, S3_ENV, free_port, s3_endpoint_fixture  # noqa: F401

from codeq.config import StoreConfig
from codeq.store import RoundLayout, open_store

REPO_ROOT = Path(__file__).resolve().parent.parent
LAYOUT = RoundLayout("jobs", 0)


def run_job(
    stage: str, env: dict[str, str], timeout: float = 120, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    full_env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("CODEQ_") and not key.startswith("JOB_COMPLETION")
    }
    full_env.update(S3_ENV)
    full_env.update({"CODEQ_STORE__RUN": LAYOUT.run, "CODEQ_STORE__ROUND": "0"})
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", f"jobs.{stage}", *args],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def file_store(tmp_path):
    root = tmp_path / "store"
    return open_store(StoreConfig(uri=f"file://{root}")), {"CODEQ_STORE__URI": f"file://{root}"}


def put_stage(store, prefix: str, folder: Path, files: dict[str, str], **marker) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    store.put_dir(prefix, folder)
    store.mark_complete(prefix, marker)


def assert_bad_input(result, message_part: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    errors = error_lines(result)
    assert len(errors) == 1 and message_part in errors[0], result.stderr[-2000:]


def test_pairs_without_collect_output(file_store):
    store, env = file_store
    result = run_job("pairs", env)
    assert_bad_input(result, "no completed collect shard")
    assert not store.is_complete(LAYOUT.stage("pairs"))


def test_pairs_with_a_missing_shard(file_store, tmp_path):
    store, env = file_store
    put_stage(
        store,
        LAYOUT.shard(1),
        tmp_path / "s1",
        {"trajectories.jsonl": ""},
        shard_index=1,
        shard_count=2,
    )
    result = run_job("pairs", env)
    assert_bad_input(result, "collect shard(s) [0] of 2 are not complete")
    assert not store.is_complete(LAYOUT.stage("pairs"))


def test_pairs_with_malformed_jsonl(file_store, tmp_path):
    store, env = file_store
    put_stage(
        store,
        LAYOUT.shard(0),
        tmp_path / "s0",
        {"trajectories.jsonl": '{"task_id": "x", "nodes": "oops"}\n'},
        shard_index=0,
        shard_count=1,
    )
    result = run_job("pairs", env)
    assert_bad_input(result, "trajectories.jsonl:1: not a valid Trajectory record")
    assert not store.is_complete(LAYOUT.stage("pairs"))


def test_train_with_corrupt_pairs(file_store, tmp_path):
    store, env = file_store
    put_stage(store, LAYOUT.stage("pairs"), tmp_path / "p", {"pairs.jsonl": "{}\n"})
    store.put_bytes(LAYOUT.stage("pairs") + "/pairs.jsonl", b"tampered\n")
    result = run_job("train", env)
    assert_bad_input(result, "fails its checksum")
    assert not store.is_complete(LAYOUT.stage("adapter"))


def test_evaluate_without_adapter(file_store, tmp_path):
    store, env = file_store
    put_stage(store, LAYOUT.stage("tasks"), tmp_path / "t", {"test.jsonl": "", "train.jsonl": ""})
    result = run_job("evaluate", env)
    assert_bad_input(result, "the adapter")
    assert "is not complete" in error_lines(result)[0]
    assert not store.is_complete(LAYOUT.stage("eval"))


def test_evaluate_with_an_adapter_folder_lacking_its_config(file_store, tmp_path):
    store, env = file_store
    put_stage(store, LAYOUT.stage("tasks"), tmp_path / "t", {"test.jsonl": "", "train.jsonl": ""})
    put_stage(store, LAYOUT.stage("adapter"), tmp_path / "a", {"README.md": "x"}, trained=True)
    result = run_job("evaluate", env)
    assert_bad_input(result, "holds no adapter_config.json")
    assert not store.is_complete(LAYOUT.stage("eval"))


def test_collect_without_tasks(file_store):
    store, env = file_store
    result = run_job("collect", {**env, "JOB_COMPLETION_INDEX": "0", "JOB_COMPLETION_COUNT": "2"})
    assert_bad_input(result, "tasks (prepare) is not complete")
    assert not store.is_complete(LAYOUT.shard(0))


@pytest.mark.parametrize("stage", ["collect", "evaluate"])
def test_a_sharded_stage_with_an_index_outside_the_count(file_store, stage):
    _, env = file_store
    result = run_job(stage, {**env, "JOB_COMPLETION_INDEX": "3", "JOB_COMPLETION_COUNT": "2"})
    assert_bad_input(result, "JOB_COMPLETION_INDEX=3 is outside 0..1")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CODEQ_SEARCH__ROLLOUTS": "0"}, "invalid config: search.rollouts"),
        ({"CODEQ_STORE__URI": "ftp://nowhere"}, "is neither file://PATH nor s3://"),
    ],
)
def test_bad_config(file_store, env, message):
    _, base_env = file_store
    result = run_job("pairs", {**base_env, **env})
    assert_bad_input(result, message)


def test_bad_config_file(file_store, tmp_path):
    _, env = file_store
    config_file = tmp_path / "config.yaml"
    config_file.write_text("search:\n  no_such_key: 1\n")
    result = run_job("prepare", {**env, "CODEQ_CONFIG_FILE": str(config_file)})
    assert_bad_input(result, "search.no_such_key: unknown key")


def test_unreachable_store_is_transient(tmp_path):
    env = {
        "CODEQ_STORE__URI": f"s3://{BUCKET}/x",
        "CODEQ_STORE__ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "CODEQ_STORE__MAX_ATTEMPTS": "1",
        "CODEQ_STORE__CONNECT_TIMEOUT_S": "1",
    }
    result = run_job("pairs", env)
    assert result.returncode == 75, result.stderr[-2000:]
    assert len(error_lines(result)) == 1 and "no S3 endpoint answers" in error_lines(result)[0]


def test_job_logs_effective_config_and_skips_completed_stage(s3_endpoint, tmp_path):
    uri = f"s3://{BUCKET}/skip-test"
    store = open_store(StoreConfig(uri=uri, endpoint_url=s3_endpoint.url, region="us-east-1"))
    put_stage(store, LAYOUT.stage("pairs"), tmp_path / "p", {"pairs.jsonl": ""})
    env = {"CODEQ_STORE__URI": uri, "CODEQ_STORE__ENDPOINT_URL": s3_endpoint.url}
    result = run_job("pairs", env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already complete" in result.stderr
    assert f"uri: {uri}" in result.stderr  # the effective config is logged
