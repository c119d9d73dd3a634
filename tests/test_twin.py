"""The container twin of the cluster (tests/twin.py): a whole round through the rendered chart's
Job specs in Docker, specs broken on purpose, and a collect pod preempted for real. Needs a
Docker engine: skipped with the reason where there is none, failed instead when
CODEQ_REQUIRE_DOCKER=1 (as in .ci/run)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from tests import containers, twin

pytestmark = pytest.mark.slow

STAGE_OUTPUTS = [
    "tasks",
    "trajectories/shard-0",
    "trajectories/shard-1",
    "verifier",
    "pairs",
    "adapter",
    "eval-shards/shard-0",
    "eval-shards/shard-1",
    "eval",
    "promote",
    "report",
]


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    problem = containers.engine_problem()
    if problem:
        if os.environ.get("CODEQ_REQUIRE_DOCKER") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return containers.build_images("cpu")


def test_two_rounds_in_one_submission_run_through_the_charts_job_specs_and_leave_reports_in_s3(
    images, tmp_path
):
    """The multi-round path (argo/rounds.yaml with `rounds`=2; one test, not two, so CI runs
    the twin's rounds once). A first submission fails: its evaluate pods cannot find runsc and
    exit 3, which is not retried; their logs stay. The resubmission, with the chart mended,
    resumes round 0 at evaluate (the stages before it skip) and goes on: after round 0 the
    `continue` pod reads the store and round 1 runs in the same workflow, with Jobs of its own.
    Round 0 is forced to promote (promotion.force_rounds), so round 1 samples from round 0's
    policy, merged once and kept in the store. Evaluate runs as 2 shards and train as 2 gloo
    processes (twin-values.yaml)."""
    from codeq.schemas import Lineage

    started = time.monotonic()
    values = twin.twin_values({"config": {"promotion": {"force_rounds": [0]}}})
    good = twin.render(values)
    broken = twin.with_manifest(
        good, "evaluate-start", add_env("CODEQ_SANDBOX__RUNSC_PATH", "/no/runsc")
    )
    parameters = {"rounds": "2"}
    with twin.running_twin(
        objects=broken, work=tmp_path / "twin", parameters=parameters
    ) as cluster:
        with pytest.raises(twin.TwinError) as failure:
            cluster.run_round()
        failed = list(cluster.jobs)  # the first submission's Jobs
        cluster.install(good)  # helm upgrade with the mended chart, then argo submit again
        outcome = cluster.run_round()
        uri, local = cluster.report(outcome["run"], "0", tmp_path / "report")
        keys = set(cluster.keys("runs/twin/"))
        prefix = cluster.keys()[0].split("/runs/")[0]
        shard = json.loads(
            cluster.get(f"{prefix}/runs/twin/round-0/trajectories/shard-1/_COMPLETE")
        )
        decision = json.loads(cluster.get(f"{prefix}/runs/twin/round-0/promote/decision.json"))
        round_1_shards = [
            json.loads(
                cluster.get(f"{prefix}/runs/twin/round-1/trajectories/shard-{index}/_COMPLETE")
            )
            for index in (0, 1)
        ]
        evaluations = [
            json.loads(cluster.get(f"{prefix}/runs/twin/round-{number}/eval/_COMPLETE"))
            for number in (0, 1)
        ]
        logs = {
            name: [pod.log_path.read_text() for pod in job.pods]
            for name, job in cluster.jobs.items()
        }
        exit_codes = {
            name: [pod.exit_code for pod in job.pods] for name, job in cluster.jobs.items()
        }
        seccomp = sorted(
            p.relative_to(cluster.seccomp_root) for p in cluster.seccomp_root.rglob("*")
        )
        jobs = list(cluster.jobs)
        timings = list(cluster.timings)
    print(f"twin rounds in {time.monotonic() - started:.0f} s: {timings}")
    # The failed submission: evaluate's shards exited 3 once each (no retry); logs kept.
    message = str(failure.value)
    assert message.startswith("Job codeq-round-") and "-r0-evaluate failed" in message, message
    first = failed[0].rsplit("-r0-", 1)[0]  # the first submission's workflow
    assert exit_codes[f"{first}-r0-evaluate"] == [3, 3]
    for text in logs[f"{first}-r0-evaluate"]:
        assert "error: sandbox.backend=gvisor but runsc was not found" in text
    assert not any(name.endswith(("-promote", "-report")) for name in failed)
    # The resubmission resumed round 0: what had finished was skipped, not recomputed.
    assert (outcome["run"], outcome["round"], outcome["rounds"]) == ("twin", "0", ["0", "1"])
    stages = ["prepare", "collect", "verifier", "pairs", "train", "evaluate", "promote", "report"]
    workflow = outcome["workflow"]
    assert jobs == [
        *failed,
        *(f"{workflow}-r{number}-{stage}" for number in (0, 1) for stage in stages),
    ]
    for stage in ("prepare", "verifier", "pairs", "train"):
        (resumed,) = logs[f"{workflow}-r0-{stage}"]
        assert f"{stage}: already complete at" in resumed, (stage, resumed[-500:])
    for number in (0, 1):
        for output in STAGE_OUTPUTS:
            base = f"{prefix}/runs/twin/round-{number}/{output}"
            assert f"{base}/_COMPLETE" in keys, (number, output)
            assert f"{base}/MANIFEST.json" in keys, (number, output)
    assert shard["shard_count"] == 2
    # Round 0 was forced to promote; round 1's collect shards searched with its policy, merged
    # by round 0's evaluate and downloaded from the store, not merged again.
    assert decision["promote"] and decision["forced"], decision["reason"]
    promoted = Lineage.model_validate(decision["candidate"])
    assert [s["policy"] for s in round_1_shards] == [promoted.id, promoted.id]
    assert any(key.startswith(f"{prefix}/runs/twin/merged/") for key in keys)
    round_1_collect = logs[f"{workflow}-r1-collect"]
    assert all(f"policy: the merged {promoted.id} from" in text for text in round_1_collect)
    # Evaluate ran as a 2-shard Indexed Job in each round; the last shard merged eval/.
    assert [e["shards"] for e in evaluations] == [2, 2]
    assert [len(logs[f"{workflow}-r{n}-evaluate"]) for n in (0, 1)] == [2, 2]
    for n in (0, 1):  # each shard had a validation and a test task
        assert not any(
            "groups is this shard's" in text for text in logs[f"{workflow}-r{n}-evaluate"]
        )
    # Train ran as two data-parallel processes (round 0's in the first submission).
    for text in logs[f"{first}-r0-train"] + logs[f"{workflow}-r1-train"]:
        assert "DPO in 2 data-parallel processes" in text
    assert uri == f"s3://codeq-twin/{prefix}/runs/twin/round-0/report/index.html"
    assert "<html" in local.read_text().lower()
    # The sandbox ran nested gVisor under the profile the chart's DaemonSet put on the node.
    assert [str(p) for p in seccomp] == ["codeq", "codeq/codeq", "codeq/codeq/codeq-sandbox.json"]
    searched = logs[f"{first}-r0-collect"] + logs[f"{workflow}-r1-collect"]
    assert len(searched) == 4
    assert all("gvisor workers" in text for text in searched)


# ------------------------------------------------------------------------- broken on purpose


def rename_env(old: str, new: str):
    def edit(job: dict[str, Any]) -> None:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        (variable,) = [e for e in container["env"] if e["name"] == old]
        variable["name"] = new

    return edit


def add_env(name: str, value: str):
    def edit(job: dict[str, Any]) -> None:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        container["env"].append({"name": name, "value": value})

    return edit


def drop_volume(name: str):
    def edit(job: dict[str, Any]) -> None:
        pod = job["spec"]["template"]["spec"]
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != name]

    return edit


def move_mount(name: str, path: str):
    def edit(job: dict[str, Any]) -> None:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == name]
        mount["mountPath"] = path

    return edit


BROKEN = {
    # A misspelt variable: the stage's config refuses it (exit 2, not retried).
    "wrong env var name": (
        "prepare-start",
        rename_env("CODEQ_STORE__URI", "CODEQ_STORE__URL"),
        [
            "-prepare failed",
            "PodFailurePolicy",
            "exit 2",
            "unknown environment variable CODEQ_STORE__URL",
            "did you mean CODEQ_STORE__URI?",
        ],
    ),
    # A mount without its volume: the API server would reject the Job; nothing runs.
    "missing volume": (
        "collect-start",
        drop_volume("tmp"),
        ["-collect", "mounts volume 'tmp' at /tmp, but the pod has no such volume"],
    ),
    # The config mounted elsewhere than CODEQ_CONFIG_FILE says.
    "config mounted elsewhere": (
        "prepare-start",
        move_mount("config", "/etc/codeq-config"),
        ["-prepare failed", "config file not found: /etc/codeq/config.yaml"],
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_spec_broken_on_purpose_fails_the_twin_naming_the_job_and_the_problem(
    images, tmp_path, broken
):
    template, edit, expected = BROKEN[broken]
    objects = twin.with_manifest(twin.render(twin.twin_values()), template, edit)
    with (
        twin.running_twin(objects=objects, work=tmp_path / "twin") as cluster,
        pytest.raises(twin.TwinError) as failure,
    ):
        cluster.run_round()
    message = str(failure.value)
    print(message)
    for part in expected:
        assert part in message, (part, message)
    assert message.startswith(("Job codeq-round-", "step "))


# ------------------------------------------------------------------------------ preemption


def shard_objects(cluster: twin.Twin, prefix: str) -> dict[str, bytes]:
    root = cluster.keys()[0].split("/runs/")[0]
    return {key: cluster.get(key) for key in cluster.keys(prefix) if key.startswith(root)}


def task_ids(objects: dict[str, bytes]) -> set[str]:
    """Every per-task object must parse as a whole trajectory (no partial object)."""
    from codeq.schemas import Trajectory

    found = set()
    for key, body in objects.items():
        if "/tasks/" in key:
            trajectory = Trajectory.model_validate_json(body)
            assert key.endswith(f"/tasks/{trajectory.task_id}.json"), key
            found.add(trajectory.task_id)
    return found


def interrupt_after(
    cluster: twin.Twin, prefix: str, done: int, signal: str, names: list[str]
) -> threading.Thread:
    """Once `done` tasks of the shard are in S3, stop its pod: `docker stop` (SIGTERM, SIGKILL
    after the pod's grace period) as the kubelet does on preemption, or SIGKILL at once, which
    is where a stage that overran its grace period ends up."""

    def watch() -> None:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if names and len([k for k in cluster.keys(prefix) if "/tasks/" in k]) >= done:
                if signal == "TERM":
                    cluster.stop(names[0], 120)
                else:
                    containers.docker("kill", "-s", "KILL", names[0], check=False)
                return
            time.sleep(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_collect_pod_stopped_mid_way_loses_and_duplicates_no_task(images, tmp_path):
    from codeq.schemas import Task
    from codeq.shards import shard_of

    values = twin.twin_values(
        {"config": {"tasks": {"max_items": 12}, "search": {"parallel_trees": 1}}}
    )
    with twin.running_twin(values, tmp_path / "twin") as cluster:
        outcome = cluster.run_round(stop_after="prepare")
        job = cluster.job_manifest("collect", outcome["scope"])
        name, pod = job["metadata"]["name"], job["spec"]["template"]["spec"]
        count = int(job["spec"]["completions"])
        base = f"runs/{outcome['run']}/round-{outcome['round']}"
        root = cluster.keys()[0].split("/runs/")[0]
        train = [
            Task.model_validate_json(line)
            for line in cluster.get(f"{root}/{base}/tasks/train.jsonl").decode().splitlines()
            if line.strip()
        ]
        wanted = {task.task_id for task in shard_of(train, 0, count)}
        assert len(wanted) >= 3, "the shard needs tasks before, at and after the stops"
        prefix = f"{base}/trajectories/shard-0/"
        runs = []
        for attempt, (signal, done) in enumerate([("TERM", 1), ("KILL", 2), (None, None)]):
            names: list[str] = []
            watcher = interrupt_after(cluster, prefix, done, signal, names) if signal else None
            result = cluster.run_pod(
                f"Job {name}", pod, f"{name}-0-{attempt}", index=0, on_start=names.append
            )
            if watcher:
                watcher.join(timeout=60)
            objects = shard_objects(cluster, prefix)
            runs.append((signal, result, objects, task_ids(objects)))
    (_, stopped, after_stop, ids_stop), (_, killed, after_kill, ids_kill), final = runs
    # SIGTERM reached the stage through tini: a clean stop (143), no marker, no shard file.
    assert stopped.exit_code == 143, stopped.tail()
    assert "terminated (SIGTERM)" in stopped.log_path.read_text()
    # SIGKILL: the container dies at once (137).
    assert killed.exit_code == 137, killed.tail()
    for objects in (after_stop, after_kill):
        assert not any(k.endswith(("_COMPLETE", "trajectories.jsonl")) for k in objects)
    assert 1 <= len(ids_stop) < len(ids_kill) < len(wanted)
    assert ids_stop <= ids_kill <= wanted
    # The third pod resumes from the store and finishes the shard.
    _, finished, after, ids = final
    assert finished.exit_code == 0, finished.tail()
    assert f"{len(ids_kill)} task(s) restored from the store" in finished.log_path.read_text()
    assert ids == wanted
    lines = after[f"{root}/{prefix}trajectories.jsonl"].decode().splitlines()
    written = [json.loads(line)["task_id"] for line in lines if line.strip()]
    assert sorted(written) == sorted(wanted), "each task exactly once"
    marker = json.loads(after[f"{root}/{prefix}_COMPLETE"])
    assert marker["trajectories"] == len(wanted)
    print(
        f"stopped after {len(ids_stop)}, killed after {len(ids_kill)} of {len(wanted)} tasks; "
        f"pods: {stopped.seconds:.0f} s, {killed.seconds:.0f} s, {finished.seconds:.0f} s"
    )
