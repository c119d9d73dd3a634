"""The scripts the chart ships for the round's own steps, run as the rendered steps run them
(files/watch_job.py, each stage's `finish`; files/fence_run.py, the round's first step) against
a small HTTP server answering the Kubernetes API calls they make: get, list, merge-patch and
delete of batch/v1 Jobs, get of the argoproj.io Workflow."""

from __future__ import annotations

import copy
import importlib.util
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest
from fake_kube_api import TOKEN, KubeApiHandler, merge_patch, serving
from test_helm import ARGO_SAMPLE, objects, substitute, templates, workflow_template

NAMESPACE = "codeq"
WORKFLOW = ARGO_SAMPLE["workflow.name"]
RUN = ARGO_SAMPLE["workflow.parameters.run"]
JOBS_PATH = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
WORKFLOWS_PATH = f"/apis/argoproj.io/v1alpha1/namespaces/{NAMESPACE}/workflows"
NOW = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
LONG_AGO = "2020-01-01T00:00:00Z"


def conditions(*entries: tuple[str, str, str]) -> list[dict[str, str]]:
    return [{"type": t, "status": s, "reason": r, "message": r} for t, s, r in entries]


# The Job states a stage step must tell apart (status only), and what `finish` makes of them.
JOB_STATES = {
    # Kueue holds it: suspended, no startTime, nothing failed.
    "queued": {"conditions": conditions(("Suspended", "True", "JobSuspended"))},
    "running": {"startTime": "t", "active": 1, "ready": 1},
    # Admitted but its pods never schedule: the Job object shows nothing; its
    # activeDeadlineSeconds (counted from startTime) turns this into DeadlineExceeded.
    "unschedulable": {"startTime": "t", "active": 1, "ready": 0},
    "some shards failed": {"startTime": "t", "active": 2, "failed": 2, "failedIndexes": "1"},
    "complete": {
        "startTime": "t",
        "completionTime": "t",
        "succeeded": 1,
        "conditions": conditions(
            ("SuccessCriteriaMet", "True", "CompletionsReached"),
            ("Complete", "True", "CompletionsReached"),
        ),
    },
    "failed": {
        "startTime": "t",
        "failed": 3,
        "conditions": conditions(
            ("FailureTarget", "True", "BackoffLimitExceeded"),
            ("Failed", "True", "BackoffLimitExceeded"),
        ),
    },
    # Resumed by Kueue, then over its deadline: the failure is not condition 0.
    "failed after queueing": {
        "startTime": "t",
        "failed": 1,
        "conditions": conditions(
            ("Suspended", "False", "JobResumed"),
            ("FailureTarget", "True", "DeadlineExceeded"),
            ("Failed", "True", "DeadlineExceeded"),
        ),
    },
    "exit code 2": {
        "startTime": "t",
        "failed": 1,
        "conditions": conditions(
            ("Suspended", "False", "JobResumed"),
            ("Failed", "True", "PodFailurePolicy"),
        ),
    },
    "failed, reason unknown to the chart": {
        "startTime": "t",
        "conditions": conditions(
            ("Suspended", "False", "JobResumed"),
            ("SuccessCriteriaMet", "False", "x"),
            ("Failed", "True", "SomeFutureReason"),
        ),
    },
}
EXPECTED = {
    # state: (what finish makes of it, the reason a failure must name)
    "queued": ("queued", None),
    "running": ("running", None),
    "unschedulable": ("running", None),
    "some shards failed": ("running", None),
    "complete": ("complete", None),
    "failed": ("failed", "BackoffLimitExceeded"),
    "failed after queueing": ("failed", "DeadlineExceeded"),
    "exit code 2": ("failed", "PodFailurePolicy"),
    "failed, reason unknown to the chart": ("failed", "SomeFutureReason"),
}


def job(
    name: str,
    status: dict[str, Any],
    *,
    workflow: str = WORKFLOW,
    run: str = RUN,
    created: str = NOW,
    suspend: bool | None = None,
    **labels: str,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"completions": 1}
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "labels": {
                "workflows.argoproj.io/workflow": workflow,
                "codeq.io/stage": name.rsplit("-", 1)[-1],
                **labels,
            },
            "annotations": {"codeq.io/run": run},
        },
        "spec": spec,
        "status": copy.deepcopy(status),
    }


class FakeApi(KubeApiHandler):
    """Jobs and Workflows by name. `timeline[name]` holds the statuses that successive GETs of
    that Job return (the last one stays; `_suspend` in one sets spec.suspend, as Kueue does).
    After each list, stopped Jobs lose their pods unless `pods_never_stop`."""

    jobs: dict[str, dict[str, Any]] = {}
    workflows: dict[str, dict[str, Any]] = {}
    timeline: dict[str, list[dict[str, Any]]] = {}
    pods_never_stop = False
    calls: list[tuple[str, str, Any]] = []
    lock = threading.Lock()

    def do_GET(self) -> None:
        if not self._authorized():
            return
        url = urlparse(self.path)
        with self.lock:
            if url.path.startswith(WORKFLOWS_PATH + "/"):
                name = url.path.rsplit("/", 1)[1]
                self.calls.append(("GET", f"workflow/{name}", None))
                found = self.workflows.get(name)
                self._reply(200 if found else 404, found or {"kind": "Status", "code": 404})
                return
            assert url.path.startswith(JOBS_PATH), url.path
            name = url.path[len(JOBS_PATH) :].strip("/")
            if name:
                self.calls.append(("GET", name, None))
                if name in self.timeline and name in self.jobs:
                    steps = self.timeline[name]
                    step = copy.deepcopy(steps.pop(0) if len(steps) > 1 else steps[0])
                    if "_suspend" in step:  # Kueue flips spec.suspend
                        self.jobs[name]["spec"]["suspend"] = step.pop("_suspend")
                    self.jobs[name]["status"] = step
                found = self.jobs.get(name)
                self._reply(200 if found else 404, found or {"kind": "Status", "code": 404})
                return
            selector = unquote(parse_qs(url.query)["labelSelector"][0])
            self.calls.append(("LIST", selector, None))
            key, _, value = selector.partition("=")
            items = [
                j
                for j in self.jobs.values()
                if key in j["metadata"]["labels"]
                and (not value or j["metadata"]["labels"][key] == value)
            ]
            self._reply(200, {"kind": "JobList", "items": copy.deepcopy(items)})
            self._settle()

    def _settle(self) -> None:
        """After a list, stopped Jobs lose their pods (the kubelet's grace period passed)."""
        if self.pods_never_stop:
            return
        for name, found in list(self.jobs.items()):
            if found["metadata"].get("deletionTimestamp"):
                del self.jobs[name]
            elif found["spec"].get("suspend"):
                found["status"].pop("active", None)

    def do_PATCH(self) -> None:
        if not self._authorized():
            return
        body = self._merge_patch_body()
        name = urlparse(self.path).path[len(JOBS_PATH) :].strip("/")
        with self.lock:
            self.calls.append(("PATCH", name, body))
            if name not in self.jobs:
                self._reply(404, {"kind": "Status", "code": 404})
                return
            target = self.jobs[name]
            merge_patch(target, body)
            self.timeline.pop(name, None)
            self._reply(200, target)

    def do_DELETE(self) -> None:
        if not self._authorized():
            return
        url = urlparse(self.path)
        name = url.path[len(JOBS_PATH) :].strip("/")
        with self.lock:
            self.calls.append(("DELETE", name, parse_qs(url.query)))
            if name not in self.jobs:
                self._reply(404, {"kind": "Status", "code": 404})
                return
            target = self.jobs[name]
            self.timeline.pop(name, None)
            if parse_qs(url.query)["propagationPolicy"] == ["Foreground"]:
                target["metadata"]["deletionTimestamp"] = NOW
            else:
                del self.jobs[name]
            self._reply(200, target)


@pytest.fixture()
def api():
    FakeApi.jobs, FakeApi.workflows, FakeApi.timeline, FakeApi.calls = {}, {}, {}, []
    FakeApi.pods_never_stop = False
    with serving(FakeApi) as url:
        yield url


def scripts_folder(tmp_path: Path) -> Path:
    """The scripts ConfigMap as the step's pod mounts it."""
    (scripts,) = [o for o in objects("default") if o["metadata"]["name"] == "codeq-scripts"]
    folder = tmp_path / "codeq-scripts"
    folder.mkdir(exist_ok=True)
    for name, text in scripts["data"].items():
        (folder / name).write_text(text)
    return folder


def step_command(template: str, table: dict[str, str], folder: Path) -> list[str]:
    """The rendered step's command, Argo expressions substituted, the script from `folder`."""
    command = [
        substitute(part, table) for part in templates("default")[template]["container"]["command"]
    ]
    assert command[0] == "python" and command[1].startswith("/etc/codeq-scripts/")
    return [sys.executable, str(folder / Path(command[1]).name), *command[2:]]


def start_step(
    tmp_path: Path, api_url: str, template: str, extra: list[str] | None = None, **table: str
) -> subprocess.Popen[str]:
    folder = scripts_folder(tmp_path)
    account = tmp_path / "serviceaccount"
    account.mkdir(exist_ok=True)
    (account / "token").write_text(TOKEN + "\n")
    (account / "namespace").write_text(NAMESPACE)
    command = step_command(template, {**ARGO_SAMPLE, **table}, folder)
    if extra is not None:  # the script's arguments, in the rendered step's order
        assert len(extra) >= len(command) - 2
        command = [*command[:2], *extra]
    env = {
        "KUBERNETES_API_URL": api_url,
        "SERVICE_ACCOUNT_DIR": str(account),
        "TERMINATION_LOG": str(tmp_path / "termination-log"),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish_step(tmp_path: Path, api_url: str, job_name: str, start_timeout: str = "21600"):
    """`finish` for one Job, polling every 0.05 s instead of 10 s."""
    return start_step(
        tmp_path,
        api_url,
        "finish",
        extra=[job_name, WORKFLOW, start_timeout, "0.05"],
        **{"inputs.parameters.job": job_name},
    )


def script_module(tmp_path: Path, name: str) -> Any:
    folder = scripts_folder(tmp_path)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("release_jobs", None)


def wait_for_line(process: subprocess.Popen[str], text: str) -> list[str]:
    assert process.stdout
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never printed: {lines}")


# ----------------------------------------------------------------------------- finish


@pytest.mark.parametrize("state", sorted(JOB_STATES))
def test_finish_judges_every_job_state(tmp_path, state):
    watch = script_module(tmp_path, "watch_job")
    found, line = watch.summary(job(f"{WORKFLOW}-collect", JOB_STATES[state]))
    expected, reason = EXPECTED[state]
    assert found == expected, line
    if reason:
        assert reason in line, line


def test_finish_logs_each_change_once_and_succeeds_when_the_job_completes(tmp_path, api):
    name = f"{WORKFLOW}-collect"
    queued = {"conditions": conditions(("Suspended", "True", "JobSuspended"))}
    one = {"startTime": NOW, "active": 8, "ready": 2, "_suspend": False}
    two = {"startTime": NOW, "active": 8, "ready": 8}
    FakeApi.jobs[name] = job(name, queued, suspend=True)
    FakeApi.timeline[name] = [queued] * 5 + [one] * 5 + [two] * 20 + [JOB_STATES["complete"]]
    process = finish_step(tmp_path, api, name)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    lines = [line.split(" ", 1)[1] for line in out.splitlines()]
    assert lines == [
        f"Job {name}: queued (suspended, waiting for Kueue to admit it)",
        f"Job {name}: running: 8 pod(s) active (2 ready), 0/1 succeeded",
        f"Job {name}: running: 8 pod(s) active (8 ready), 0/1 succeeded",
        f"Job {name}: complete",
    ]
    polls = [c for c in FakeApi.calls if c[:2] == ("GET", name)]
    assert len(polls) >= 31, "each poll read the Job; only changes were logged"


@pytest.mark.parametrize("state", ["failed after queueing", "exit code 2", "failed"])
def test_finish_fails_with_the_jobs_reason_as_its_message(tmp_path, api, state):
    name = f"{WORKFLOW}-train"
    FakeApi.jobs[name] = job(name, JOB_STATES["running"])
    FakeApi.timeline[name] = [JOB_STATES["running"]] * 3 + [JOB_STATES[state]]
    process = finish_step(tmp_path, api, name)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    reason = EXPECTED[state][1]
    assert err.splitlines()[-1].split(" ", 1)[1].startswith(f"error: Job {name} failed: {reason}")
    # Argo shows the main container's termination message as the step's message.
    assert (tmp_path / "termination-log").read_text().startswith(f"Job {name} failed: {reason}")
    assert not [c for c in FakeApi.calls if c[0] in ("PATCH", "DELETE")], "a failed Job is kept"


@pytest.mark.parametrize("kueue", [False, True])
def test_a_job_queued_past_the_start_timeout_is_stopped_and_fails_the_step(tmp_path, api, kueue):
    name = f"{WORKFLOW}-evaluate"
    labels = {"kueue.x-k8s.io/queue-name": "codeq"} if kueue else {}
    FakeApi.jobs[name] = job(name, JOB_STATES["queued"], created=LONG_AGO, suspend=True, **labels)
    process = finish_step(tmp_path, api, name, start_timeout="3600")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "did not start within 3600 s (workflow.startTimeout)" in err
    if kueue:
        assert name not in FakeApi.jobs, "Kueue would admit a suspended Job later: deleted"
    else:
        assert FakeApi.jobs[name]["metadata"]["labels"]["codeq.io/outcome"] == "stopped"


def test_the_start_timeout_counts_from_the_latest_suspension(tmp_path, api):
    """Kueue suspends a preempted Job and queues it again: its wait counts from then."""
    name = f"{WORKFLOW}-train"
    requeued = {
        "conditions": [
            {
                "type": "Suspended",
                "status": "True",
                "reason": "Preempted",
                "lastTransitionTime": NOW,
            }
        ]
    }
    FakeApi.jobs[name] = job(name, requeued, created=LONG_AGO, suspend=True)
    FakeApi.timeline[name] = [requeued] * 10 + [JOB_STATES["complete"]]
    process = finish_step(tmp_path, api, name, start_timeout="3600")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


def test_a_job_deleted_under_the_step_fails_it(tmp_path, api):
    process = finish_step(tmp_path, api, f"{WORKFLOW}-pairs")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "does not exist" in err


@pytest.mark.parametrize(
    ("workflow", "why"),
    [
        ({"spec": {"shutdown": "Terminate"}, "status": {"phase": "Running"}}, "was terminated"),
        ({"spec": {"shutdown": "Stop"}, "status": {"phase": "Running"}}, "was stopped"),
        (None, "was deleted"),
        (
            {
                "spec": {},
                "status": {
                    "phase": "Running",
                    "startedAt": LONG_AGO,
                    "storedWorkflowTemplateSpec": {"activeDeadlineSeconds": 3600},
                },
            },
            "is past its deadline",
        ),
    ],
)
def test_stopped_with_its_workflow_the_step_stops_the_job(tmp_path, api, workflow, why):
    """`argo terminate` skips the exit handler but still SIGTERMs the running pods: the watching
    step stops its Job, so nothing of the round writes to the store after it."""
    name = f"{WORKFLOW}-collect"
    FakeApi.jobs[name] = job(name, JOB_STATES["running"])
    if workflow:
        FakeApi.workflows[WORKFLOW] = {"metadata": {"name": WORKFLOW}, **workflow}
    process = finish_step(tmp_path, api, name)
    wait_for_line(process, "running:")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert FakeApi.jobs[name]["spec"]["suspend"] is True
    assert FakeApi.jobs[name]["metadata"]["labels"]["codeq.io/outcome"] == "stopped"
    assert f"workflow {WORKFLOW} {why}" in out


def test_stopped_while_its_workflow_goes_on_the_step_leaves_the_job(tmp_path, api):
    """A drained node SIGTERMs the watching pod too: the Job runs on, the retried step (exit 75)
    watches it again."""
    name = f"{WORKFLOW}-collect"
    FakeApi.jobs[name] = job(name, JOB_STATES["running"])
    FakeApi.workflows[WORKFLOW] = {
        "metadata": {"name": WORKFLOW},
        "spec": {},
        "status": {"phase": "Running", "startedAt": NOW},
    }
    process = finish_step(tmp_path, api, name)
    wait_for_line(process, "running:")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    assert not [c for c in FakeApi.calls if c[0] in ("PATCH", "DELETE")]
    retry = templates("default")["finish"]["retryStrategy"]
    assert "asInt(lastRetry.exitCode) == 75" in retry["expression"]


# ----------------------------------------------------------------------------- fence


def test_the_fence_stops_jobs_of_the_run_left_by_an_earlier_workflow(tmp_path, api):
    earlier = "codeq-round-old42"
    running = JOB_STATES["running"]
    for found in (
        job(f"{earlier}-collect", running, workflow=earlier),  # orphan
        job(f"{earlier}-train", running, workflow=earlier, **{"kueue.x-k8s.io/queue-name": "q"}),
        job(f"{earlier}-prepare", JOB_STATES["complete"], workflow=earlier),
        job(f"{earlier}-pairs", {"startTime": NOW}, workflow=earlier, suspend=True),
        job("codeq-round-other-collect", running, workflow="codeq-round-other", run="another"),
        job(f"{WORKFLOW}-prepare", running),  # this round's own
    ):
        FakeApi.jobs[found["metadata"]["name"]] = found
    before = copy.deepcopy(FakeApi.jobs)
    process = start_step(tmp_path, api, "fence", extra=[RUN, WORKFLOW, "30", "0.05"])
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    stopped = FakeApi.jobs[f"{earlier}-collect"]
    assert stopped["spec"]["suspend"] is True
    assert stopped["metadata"]["labels"]["codeq.io/outcome"] == "stopped"
    assert f"{earlier}-train" not in FakeApi.jobs
    deletes = [c for c in FakeApi.calls if c[0] == "DELETE"]
    assert deletes == [("DELETE", f"{earlier}-train", {"propagationPolicy": ["Foreground"]})]
    for untouched in (
        f"{earlier}-prepare",
        f"{earlier}-pairs",
        "codeq-round-other-collect",
        f"{WORKFLOW}-prepare",
    ):
        assert FakeApi.jobs[untouched] == before[untouched], untouched
    assert f"Job {earlier}-collect of workflow {earlier} outlived its workflow" in out


def test_the_fence_lets_nothing_start_while_orphan_pods_remain(tmp_path, api):
    earlier = "codeq-round-old42"
    FakeApi.jobs[f"{earlier}-collect"] = job(
        f"{earlier}-collect", JOB_STATES["running"], workflow=earlier
    )
    FakeApi.pods_never_stop = True
    process = start_step(tmp_path, api, "fence", extra=[RUN, WORKFLOW, "1", "0.05"])
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert f"Job(s) {earlier}-collect of run 'default' still have pods after 1 s" in err


def test_the_fence_passes_when_nothing_is_left(tmp_path, api):
    process = start_step(tmp_path, api, "fence", extra=[RUN, WORKFLOW, "30", "0.05"])
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "no stage Job of run 'default' from an earlier workflow is running" in out
    assert FakeApi.calls == [("LIST", "codeq.io/stage", None)]


def test_the_script_steps_run_with_the_workflow_identity_and_its_permissions():
    by_name = templates("default")
    spec = workflow_template("default")["spec"]
    (role,) = [o for o in objects("default") if o["kind"] == "Role"]
    verbs = {
        resource: set(rule["verbs"]) for rule in role["rules"] for resource in rule["resources"]
    }
    assert {"get", "list", "patch", "delete"} <= verbs["jobs"]
    assert "get" in verbs["workflows"]
    for name in ("fence", "finish", "release-jobs"):
        step = by_name[name]
        assert "serviceAccountName" not in step and "automountServiceAccountToken" not in step
        assert spec["serviceAccountName"] == "codeq-workflow"
    fence = by_name["fence"]["container"]["command"]
    assert fence[2:4] == ["{{workflow.parameters.run}}", "{{workflow.name}}"]
    # The fence waits out the stopped pods' grace period.
    grace = 120
    assert float(fence[4]) > grace


@pytest.mark.parametrize("kueue", [False, True])
def test_stopping_a_job_another_step_already_removed_is_no_error(tmp_path, api, monkeypatch, kueue):
    """`finish` and the exit handler both stop the running Job when a round is stopped; the
    second to get there finds it gone (a Kueue Job is deleted) and goes on."""
    release = script_module(tmp_path, "release_jobs")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN)
    (account / "namespace").write_text(NAMESPACE)
    monkeypatch.setenv("KUBERNETES_API_URL", api)
    monkeypatch.setenv("SERVICE_ACCOUNT_DIR", str(account))
    labels = {"kueue.x-k8s.io/queue-name": "codeq"} if kueue else {}
    gone = job(f"{WORKFLOW}-collect", JOB_STATES["running"], **labels)
    line = release.stop_running_job(release.Api(), gone)
    assert line == f"Job {WORKFLOW}-collect is already gone"
