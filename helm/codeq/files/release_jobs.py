"""Exit handler of a CodeQ round that did not succeed (failed, stopped, past its deadline).

Usage: python3 release_jobs.py WORKFLOW_NAME WORKFLOW_STATUS KEEP_SECONDS

For every Job of the workflow (label workflows.argoproj.io/workflow=WORKFLOW_NAME):
- still running: stop it so it holds no GPU. Suspending deletes its pods (SIGTERM first, so the
  stage stops cleanly) and keeps the Job with its earlier failed pods; a Job that Kueue manages
  (label kueue.x-k8s.io/queue-name) is deleted instead, because Kueue resumes suspended Jobs
  whose workload it has admitted. Labelled codeq.io/outcome=stopped.
- failed: kept, with its pods and their logs, labelled codeq.io/outcome=failed, and its
  ttlSecondsAfterFinished raised to KEEP_SECONDS.
- complete: left alone.
Prints one line per Job and the commands that show a failed Job's logs. Standard library only;
it runs in the infer image with the workflow ServiceAccount's token.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
OUTCOME_LABEL = "codeq.io/outcome"


class Api:
    """The few Kubernetes API calls this needs, in-cluster (KUBERNETES_API_URL overrides the
    address, e.g. for tests; the CA and token come from the ServiceAccount mount)."""

    def __init__(self) -> None:
        self.base = os.environ.get("KUBERNETES_API_URL") or "https://{}:{}".format(
            os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        )
        account = os.environ.get("SERVICE_ACCOUNT_DIR", ACCOUNT)
        with open(os.path.join(account, "token"), encoding="utf-8") as handle:
            self.token = handle.read().strip()
        with open(os.path.join(account, "namespace"), encoding="utf-8") as handle:
            self.namespace = handle.read().strip()
        ca = os.path.join(account, "ca.crt")
        self.context = ssl.create_default_context(cafile=ca) if os.path.exists(ca) else None

    def call(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type or "application/json")
        with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def jobs_path(self, name: str = "") -> str:
        path = f"/apis/batch/v1/namespaces/{self.namespace}/jobs"
        return f"{path}/{name}" if name else path

    def workflow_path(self, name: str) -> str:
        return f"/apis/argoproj.io/v1alpha1/namespaces/{self.namespace}/workflows/{name}"


def job_state(job: dict[str, Any]) -> tuple[str, str]:
    """("failed" | "complete" | "running", reason) from the Job's conditions (any position)."""
    for condition in job.get("status", {}).get("conditions", []):
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Failed", "FailureTarget"):
            return "failed", f"{condition.get('reason', '')}: {condition.get('message', '')}"
        if condition.get("type") == "Complete":
            return "complete", ""
    return "running", ""


MERGE_PATCH = "application/merge-patch+json"


def stop_running_job(api: Api, job: dict[str, Any], propagation: str = "Background") -> str:
    """Stop a Job that has not finished so it holds no GPU and writes nothing more: delete it
    when Kueue manages it (Kueue resumes a suspended Job it admitted; with `propagation`
    Foreground the Job object stays until its pods are gone), else suspend and label it, which
    deletes its pods (SIGTERM first) and keeps the Job with its earlier pods' logs."""
    name = job["metadata"]["name"]
    try:
        if QUEUE_LABEL in job["metadata"].get("labels", {}):
            api.call("DELETE", api.jobs_path(name) + f"?propagationPolicy={propagation}")
            return f"deleted running Job {name} (Kueue-managed; suspending would resume)"
        patch = {"metadata": {"labels": {OUTCOME_LABEL: "stopped"}}, "spec": {"suspend": True}}
        api.call("PATCH", api.jobs_path(name), patch, MERGE_PATCH)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        # Another step stopped it first (the stage's `finish`, or the exit handler).
        return f"Job {name} is already gone"
    return f"suspended running Job {name}: its pods stop, the Job is kept"


def release(api: Api, workflow: str, status: str, keep_seconds: int) -> list[str]:
    selector = urllib.parse.quote(f"{WORKFLOW_LABEL}={workflow}")
    jobs = api.call("GET", f"{api.jobs_path()}?labelSelector={selector}").get("items", [])
    lines = [f"workflow {workflow} ended {status}; {len(jobs)} Job(s) of this round"]
    for job in sorted(jobs, key=lambda j: j["metadata"]["name"]):
        name = job["metadata"]["name"]
        state, reason = job_state(job)
        if state == "running":
            lines.append(stop_running_job(api, job))
        elif state == "failed":
            patch = {
                "metadata": {"labels": {OUTCOME_LABEL: "failed"}},
                "spec": {"ttlSecondsAfterFinished": keep_seconds},
            }
            api.call("PATCH", api.jobs_path(name), patch, MERGE_PATCH)
            lines.append(f"kept failed Job {name} ({reason.strip(': ')}) for {keep_seconds}s")
            lines.append(
                f"  logs: kubectl -n {api.namespace} logs job/{name} --all-containers"
                f" (every pod: kubectl -n {api.namespace} logs -l batch.kubernetes.io/job-name={name})"
            )
        else:
            lines.append(f"left complete Job {name}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    workflow, status, keep = argv[1], argv[2], int(argv[3])
    try:
        lines = release(Api(), workflow, status, keep)
    except urllib.error.HTTPError as exc:
        print(f"error: Kubernetes API answered {exc.code}: {exc.read()[:500]!r}", file=sys.stderr)
        return 1
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
