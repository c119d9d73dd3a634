"""A round on a real kind cluster (hosted CI: .github/workflows/kind.yml). The workflow file
creates the cluster, installs Argo, loads the CPU images, starts MinIO and installs the chart;
these tests submit argo/round.yaml and check what Kubernetes did. Elsewhere they skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.kind

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = os.environ.get("NAMESPACE", "codeq")
STAGES = ["prepare", "collect", "pairs", "train", "evaluate", "promote", "report"]


def _require_cluster() -> None:
    missing = [tool for tool in ("docker", "kind", "kubectl", "argo") if shutil.which(tool) is None]
    reason = None
    if missing:
        reason = f"kind tests need {', '.join(missing)} on PATH and a kind cluster (see .github/workflows/kind.yml)"
    else:
        probe = subprocess.run(
            ["kubectl", "-n", NAMESPACE, "get", "workflowtemplate", "codeq-round"],
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            reason = f"no cluster with the chart installed in namespace {NAMESPACE}: {probe.stderr.strip()[:200]}"
    if reason:
        if os.environ.get("CODEQ_KIND") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def kubectl_json(*args: str) -> dict:
    out = subprocess.run(
        ["kubectl", "-n", NAMESPACE, *args, "-o", "json"],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def submit_and_wait(round_parameter: str) -> dict:
    """`argo submit argo/round.yaml -p round=<round_parameter>`, waited for; the Workflow."""
    submitted = subprocess.run(
        [
            "argo",
            "submit",
            "-n",
            NAMESPACE,
            str(REPO / "argo" / "round.yaml"),
            "-p",
            f"round={round_parameter}",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    name = submitted.stdout.strip().splitlines()[-1]
    waited = subprocess.run(
        ["argo", "wait", "-n", NAMESPACE, name], capture_output=True, text=True, timeout=5400
    )
    assert waited.returncode == 0, waited.stderr[-3000:]
    return kubectl_json("get", "workflow", name)


@pytest.fixture(scope="module")
def finished_round() -> dict:
    _require_cluster()
    return submit_and_wait("0")


@pytest.fixture(scope="module")
def next_round(finished_round) -> dict:
    """A second submission with the default round=next: round 1, after round 0 promoted
    (kind-values.yaml forces it: promotion.force_rounds [0])."""
    return submit_and_wait("next")


def test_round_succeeds(finished_round):
    assert finished_round["status"]["phase"] == "Succeeded", finished_round["status"].get("message")


def test_every_stage_ran_as_a_completed_job_owned_by_the_workflow(finished_round):
    name = finished_round["metadata"]["name"]
    jobs = kubectl_json("get", "jobs", "-l", f"workflows.argoproj.io/workflow={name}")["items"]
    by_stage = {job["metadata"]["labels"]["codeq.io/stage"]: job for job in jobs}
    assert sorted(by_stage) == sorted(STAGES)
    for stage, job in by_stage.items():
        conditions = {c["type"]: c["status"] for c in job["status"].get("conditions", [])}
        assert conditions.get("Complete") == "True", stage
        owners = job["metadata"].get("ownerReferences", [])
        assert [o["kind"] for o in owners] == ["Workflow"] and owners[0]["name"] == name
    collect = by_stage["collect"]
    assert collect["spec"]["completionMode"] == "Indexed"
    assert collect["status"]["succeeded"] == collect["spec"]["completions"]


def test_argo_logs_finds_the_stage_pods(finished_round):
    name = finished_round["metadata"]["name"]
    logs = subprocess.run(
        ["argo", "logs", "-n", NAMESPACE, name], capture_output=True, text=True, timeout=300
    )
    assert logs.returncode == 0
    pods = kubectl_json(
        "get", "pods", "-l", f"workflows.argoproj.io/workflow={name},codeq.io/job=true"
    )["items"]
    assert {p["metadata"]["labels"]["codeq.io/stage"] for p in pods} == set(STAGES)


def test_round_next_runs_round_1_from_round_0s_merged_policy(next_round):
    assert next_round["status"]["phase"] == "Succeeded", next_round["status"].get("message")
    name = next_round["metadata"]["name"]
    jobs = kubectl_json("get", "jobs", "-l", f"workflows.argoproj.io/workflow={name}")["items"]
    assert {job["metadata"]["labels"]["codeq.io/round"] for job in jobs} == {"1"}
    assert sorted(job["metadata"]["labels"]["codeq.io/stage"] for job in jobs) == sorted(STAGES)
    pods = kubectl_json(
        "get", "pods", "-l", f"workflows.argoproj.io/workflow={name},codeq.io/stage=collect"
    )["items"]
    assert pods
    for pod in pods:
        log = subprocess.run(
            ["kubectl", "-n", NAMESPACE, "logs", pod["metadata"]["name"], "-c", "main"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert "policy: the merged" in log, log[-2000:]
