"""The exit handler of a round that did not succeed: the script the chart ships in its scripts
ConfigMap, run as the release-jobs step runs it, against a small HTTP server that answers the
Kubernetes API calls it makes (list, merge-patch, delete of batch/v1 Jobs). The wiring in the
WorkflowTemplate (when it runs, with which identity and permissions) is checked too."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest
import yaml
from fake_kube_api import TOKEN, KubeApiHandler, merge_patch, serving
from test_helm import ARGO_SAMPLE, objects, substitute, templates, workflow_template

NAMESPACE = "codeq"
WORKFLOW = "codeq-round-x7k2p"


def job(name: str, workflow: str, conditions: list[tuple[str, str, str]], **labels: str):
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"workflows.argoproj.io/workflow": workflow, **labels},
        },
        "spec": {"ttlSecondsAfterFinished": 86400},
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": r} for t, s, r in conditions
            ]
        },
    }


JOBS = [
    job(f"{WORKFLOW}-prepare", WORKFLOW, [("Complete", "True", "CompletionsReached")]),
    job(
        f"{WORKFLOW}-collect",
        WORKFLOW,
        [
            ("Suspended", "False", "JobResumed"),
            ("FailureTarget", "True", "BackoffLimitExceeded"),
            ("Failed", "True", "BackoffLimitExceeded"),
        ],
    ),
    job(f"{WORKFLOW}-pairs", WORKFLOW, []),
    job(f"{WORKFLOW}-train", WORKFLOW, [], **{"kueue.x-k8s.io/queue-name": "codeq"}),
    job("codeq-round-other-collect", "codeq-round-other", []),
]


class FakeApi(KubeApiHandler):
    jobs: dict[str, dict[str, Any]] = {}
    calls: list[tuple[str, str, Any]] = []

    def _name(self, path: str) -> str | None:
        prefix = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
        assert path.startswith(prefix), path
        rest = path[len(prefix) :].strip("/")
        return rest or None

    def do_GET(self) -> None:
        if not self._authorized():
            return
        url = urlparse(self.path)
        assert self._name(url.path) is None
        selector = unquote(parse_qs(url.query)["labelSelector"][0])
        key, _, value = selector.partition("=")
        items = [j for j in self.jobs.values() if j["metadata"]["labels"].get(key) == value]
        self.calls.append(("GET", selector, None))
        self._reply(200, {"kind": "JobList", "items": items})

    def do_PATCH(self) -> None:
        if not self._authorized():
            return
        body = self._merge_patch_body()
        name = self._name(urlparse(self.path).path)
        self.calls.append(("PATCH", name, body))
        target = self.jobs[name]
        merge_patch(target, body)
        self._reply(200, target)

    def do_DELETE(self) -> None:
        if not self._authorized():
            return
        url = urlparse(self.path)
        name = self._name(url.path)
        self.calls.append(("DELETE", name, parse_qs(url.query)))
        self._reply(200, self.jobs.pop(name))


@pytest.fixture()
def api():
    FakeApi.jobs = {j["metadata"]["name"]: copy.deepcopy(j) for j in JOBS}
    FakeApi.calls = []
    with serving(FakeApi) as url:
        yield url


def run_exit_handler(
    tmp_path: Path, api_url: str, token: str = TOKEN
) -> subprocess.CompletedProcess:
    """The rendered step's command, with the script from the rendered ConfigMap."""
    (scripts,) = [o for o in objects("default") if o["metadata"]["name"] == "codeq-scripts"]
    step = templates("default")["release-jobs"]
    command = [substitute(part, ARGO_SAMPLE) for part in step["container"]["command"]]
    (mount,) = [m for m in step["container"]["volumeMounts"] if m["name"] == "scripts"]
    script = tmp_path / Path(command[1]).relative_to(mount["mountPath"])
    script.write_text(scripts["data"][script.name])
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token + "\n")
    (account / "namespace").write_text(NAMESPACE)
    env = {
        "KUBERNETES_API_URL": api_url,
        "SERVICE_ACCOUNT_DIR": str(account),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, str(script), *command[2:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_failed_job_is_kept_and_labelled_running_ones_stop_complete_ones_stay(tmp_path, api):
    result = run_exit_handler(tmp_path, api)
    assert result.returncode == 0, result.stderr
    calls = {(method, name): body for method, name, body in FakeApi.calls}
    assert ("GET", f"workflows.argoproj.io/workflow={WORKFLOW}") in calls

    failed = FakeApi.jobs[f"{WORKFLOW}-collect"]
    assert failed["metadata"]["labels"]["codeq.io/outcome"] == "failed"
    keep = int(workflow_template("default")["spec"]["ttlStrategy"]["secondsAfterFailure"])
    assert failed["spec"]["ttlSecondsAfterFinished"] == keep
    assert "suspend" not in failed["spec"]

    running = FakeApi.jobs[f"{WORKFLOW}-pairs"]
    assert running["spec"]["suspend"] is True
    assert running["metadata"]["labels"]["codeq.io/outcome"] == "stopped"

    # Kueue resumes a suspended Job whose workload it admitted: that one is deleted instead.
    assert f"{WORKFLOW}-train" not in FakeApi.jobs
    assert calls[("DELETE", f"{WORKFLOW}-train")] == {"propagationPolicy": ["Background"]}

    assert ("PATCH", f"{WORKFLOW}-prepare") not in calls
    assert ("DELETE", f"{WORKFLOW}-prepare") not in calls
    assert FakeApi.jobs["codeq-round-other-collect"] == JOBS[-1], "another round is untouched"
    assert not [c for c in FakeApi.calls if c[0] == "DELETE" and c[1] != f"{WORKFLOW}-train"]

    out = result.stdout
    assert f"kept failed Job {WORKFLOW}-collect (BackoffLimitExceeded" in out
    assert f"kubectl -n {NAMESPACE} logs job/{WORKFLOW}-collect" in out
    assert f"suspended running Job {WORKFLOW}-pairs" in out


def test_an_api_refusal_fails_the_step_with_one_line(tmp_path, api):
    result = run_exit_handler(tmp_path, api, token="a-token-the-api-refuses")
    assert result.returncode == 1
    assert result.stderr.startswith("error: Kubernetes API answered 401")


def test_the_exit_handler_runs_for_every_round_that_did_not_succeed():
    spec = workflow_template("default")["spec"]
    by_name = templates("default")
    (step,) = [s for group in by_name[spec["onExit"]]["steps"] for s in group]
    assert step["when"] == "{{workflow.status}} != Succeeded"
    release = by_name[step["template"]]
    assert "resource" not in release, "no kubectl delete of the round's Jobs any more"
    command = release["container"]["command"]
    assert command[:2] == ["python", "/etc/codeq-scripts/release_jobs.py"]
    assert command[2:4] == ["{{workflow.name}}", "{{workflow.status}}"]
    # It runs with the workflow ServiceAccount (token mounted), whose Role covers these calls.
    assert "serviceAccountName" not in release and "automountServiceAccountToken" not in release
    (role,) = [o for o in objects("default") if o["kind"] == "Role"]
    (rule,) = [r for r in role["rules"] if r["resources"] == ["jobs"]]
    assert {"list", "patch", "delete"} <= set(rule["verbs"])
    # Owner references: deleting the workflow (argo delete, ttlStrategy) deletes its Jobs.
    for name, template in by_name.items():
        if template.get("resource", {}).get("action") == "apply":
            assert template["resource"]["setOwnerReference"] is True, name


def test_the_exit_handler_can_be_turned_off():
    spec = workflow_template("default", json.dumps({"workflow": {"releaseOnFailure": False}}))[
        "spec"
    ]
    assert "onExit" not in spec
    assert not [t for t in spec["templates"] if t["name"] in ("exit-handler", "release-jobs")]


def test_the_script_is_valid_python_with_its_usage_line():
    (scripts,) = [o for o in objects("default") if o["metadata"]["name"] == "codeq-scripts"]
    for name, text in scripts["data"].items():
        compile(text, name, "exec")
    usage = subprocess.run(
        [sys.executable, "-c", scripts["data"]["release_jobs.py"]], capture_output=True, text=True
    )
    assert usage.returncode == 2 and "Usage: python3 release_jobs.py" in usage.stderr
    assert yaml.safe_dump(scripts)  # a plain ConfigMap, no Argo placeholders inside
    assert "{{" not in scripts["data"]["release_jobs.py"]
