"""Wait for one stage Job of a CodeQ round: the `finish` step of every stage.

Usage: python3 watch_job.py JOB WORKFLOW START_TIMEOUT_SECONDS [POLL_SECONDS]

Prints a line only when the Job's state changes (queued, running with its pod counts, complete,
failed with its reason), so `argo logs --follow` shows what happened and nothing else. Exit codes:
- 0: the Job completed.
- 1: it failed (its reason is the step's message), or it waited in the queue (no startTime)
  longer than START_TIMEOUT_SECONDS since it was created or last suspended (Kueue): then it is
  stopped first, as the exit handler stops Jobs.
- 143: SIGTERM while the workflow is stopped, terminated, deleted or past its deadline: the Job
  is stopped too, so nothing the round started keeps writing to the store after it.
- 75: SIGTERM while the workflow goes on (this pod's node is drained; the Job is left running and
  the retried step watches it again), or the Kubernetes API stayed unreachable.
Standard library only; runs in the infer image with the workflow ServiceAccount's token.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
from datetime import UTC, datetime
from typing import Any

from release_jobs import Api, job_state, stop_running_job

EXIT_FAILED = 1
EXIT_RETRY = 75
EXIT_STOPPED = 143
API_PATIENCE_S = 600.0
# Argo shows a failed step's termination message; the kubelet mounts this file writable.
TERMINATION_LOG = os.environ.get("TERMINATION_LOG", "/dev/termination-log")


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def summary(job: dict[str, Any]) -> tuple[str, str]:
    """(state, line): "queued" (no startTime: not admitted, or suspended again), "running",
    "complete" or "failed"; the line says what a reader of the log needs."""
    state, reason = job_state(job)
    if state == "failed":
        return "failed", f"failed: {reason.strip(': ')}"
    if state == "complete":
        return "complete", "complete"
    spec, status = job.get("spec", {}), job.get("status", {})
    if not status.get("startTime"):
        why = "suspended, waiting for Kueue to admit it" if spec.get("suspend") else "not started"
        return "queued", f"queued ({why})"
    parts = [
        f"{status.get('active', 0)} pod(s) active ({status.get('ready', 0)} ready)",
        f"{status.get('succeeded', 0)}/{spec.get('completions', 1)} succeeded",
    ]
    if status.get("failed"):
        parts.append(f"{status['failed']} pod(s) failed (retried within the Job's limits)")
    if status.get("failedIndexes"):
        parts.append(f"failed indexes {status['failedIndexes']}")
    if spec.get("suspend"):
        parts.append("suspended")
    return "running", "running: " + ", ".join(parts)


def queued_since(job: dict[str, Any]) -> float:
    """When the Job last entered the queue: its creation, or its latest suspension (Kueue
    suspends a preempted Job and admits it again later)."""
    times = [parse_time(job["metadata"]["creationTimestamp"])]
    for condition in job.get("status", {}).get("conditions", []):
        suspended = condition.get("type") == "Suspended" and condition.get("status") == "True"
        if suspended and condition.get("lastTransitionTime"):
            times.append(parse_time(condition["lastTransitionTime"]))
    return max(times)


def workflow_ended(api: Api, workflow: str) -> str:
    """Why the workflow is over ("" while it goes on): deleted, stopped, terminated, finished
    or past its deadline."""
    try:
        found = api.call("GET", api.workflow_path(workflow))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return "was deleted"
        raise
    if found.get("metadata", {}).get("deletionTimestamp"):
        return "is being deleted"
    spec, status = found.get("spec", {}), found.get("status", {})
    if spec.get("shutdown"):
        return {"Stop": "was stopped", "Terminate": "was terminated"}.get(
            spec["shutdown"], f"is shutting down ({spec['shutdown']})"
        )
    if status.get("phase") in ("Succeeded", "Failed", "Error"):
        return f"ended {status['phase']}"
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is None:
        deadline = status.get("storedWorkflowTemplateSpec", {}).get("activeDeadlineSeconds")
    started = status.get("startedAt")
    if deadline is not None and started and time.time() >= parse_time(started) + deadline:
        return "is past its deadline"
    return ""


class Watch:
    def __init__(self, api: Api, job: str, workflow: str, start_timeout: float) -> None:
        self.api = api
        self.job = job
        self.workflow = workflow
        self.start_timeout = start_timeout
        self.stopping = False
        self.last = ""

    def say(self, line: str) -> None:
        print(f"{stamp()} {line}", flush=True)

    def fail(self, message: str, code: int) -> int:
        print(f"{stamp()} error: {message}", file=sys.stderr, flush=True)
        try:
            with open(TERMINATION_LOG, "w", encoding="utf-8") as handle:
                handle.write(message[:4000])
        except OSError:
            pass
        return code

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))

    def stop(self) -> int:
        """SIGTERM: stop the Job if the workflow is over, else leave it to the retried step."""
        try:
            why = workflow_ended(self.api, self.workflow)
            if not why:
                self.say(
                    f"this pod is stopping while workflow {self.workflow} goes on (node drain?): "
                    f"Job {self.job} is left running and the retried step watches it again"
                )
                return EXIT_RETRY
            try:
                job = self.api.call("GET", self.api.jobs_path(self.job))
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
                job = None
            if job is not None and summary(job)[0] in ("queued", "running"):
                self.say(stop_running_job(self.api, job))
            self.say(f"workflow {self.workflow} {why}; Job {self.job} writes nothing more")
            return EXIT_STOPPED
        except (urllib.error.URLError, OSError) as exc:
            return self.fail(
                f"stopping, and cannot tell whether workflow {self.workflow} is over ({exc}): "
                f"Job {self.job} is left as it is (the exit handler, or the next round's first "
                "step, stops it)",
                EXIT_RETRY,
            )

    def run(self, poll: float) -> int:
        unreachable_since = 0.0
        while True:
            if self.stopping:
                return self.stop()
            try:
                job = self.api.call("GET", self.api.jobs_path(self.job))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return self.fail(
                        f"Job {self.job} does not exist (deleted while the round waited for it)",
                        EXIT_FAILED,
                    )
                if exc.code in (401, 403):
                    return self.fail(f"Kubernetes API answered {exc.code}", EXIT_FAILED)
                job, problem = None, f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                job, problem = None, str(exc)
            if job is None:
                if not unreachable_since:
                    unreachable_since = time.monotonic()
                    self.say(f"Kubernetes API unreachable ({problem}); retrying")
                elif time.monotonic() - unreachable_since > API_PATIENCE_S:
                    return self.fail(
                        f"Kubernetes API unreachable for {API_PATIENCE_S:.0f} s ({problem})",
                        EXIT_RETRY,
                    )
                self.sleep(poll)
                continue
            if unreachable_since:
                unreachable_since = 0.0
                self.say("Kubernetes API reachable again")
            state, line = summary(job)
            if line != self.last:
                self.last = line
                self.say(f"Job {self.job}: {line}")
            if state == "complete":
                return 0
            if state == "failed":
                return self.fail(f"Job {self.job} {line}", EXIT_FAILED)
            if state == "queued" and time.time() - queued_since(job) > self.start_timeout:
                self.say(stop_running_job(self.api, job))
                return self.fail(
                    f"Job {self.job} did not start within {self.start_timeout:.0f} s "
                    "(workflow.startTimeout): no quota or no node for it",
                    EXIT_FAILED,
                )
            self.sleep(poll)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    job, workflow, start_timeout = argv[1], argv[2], float(argv[3])
    poll = float(argv[4]) if len(argv) == 5 else 10.0
    watch = Watch(Api(), job, workflow, start_timeout)

    def on_sigterm(*_: Any) -> None:
        watch.stopping = True

    signal.signal(signal.SIGTERM, on_sigterm)
    return watch.run(poll)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
