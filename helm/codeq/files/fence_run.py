"""First step of every CodeQ round: stop the Jobs of its run that outlived their workflow.

Usage: python3 fence_run.py RUN WORKFLOW WAIT_SECONDS [POLL_SECONDS]

The Argo mutex codeq-run-RUN keeps two workflows of one run from overlapping, not their Jobs:
after `argo terminate` (no exit handler runs) a stage Job may go on writing under runs/RUN/ in
the store, the very prefixes the next submission writes. The mutex, which this workflow holds,
means every other workflow of RUN is over, so any stage Job of RUN made by another workflow that
has not finished is an orphan. Each is stopped as the exit handler stops a running Job
(suspended, so its pods get SIGTERM and stop cleanly while the Job keeps their logs; deleted
when Kueue manages it); one that is already suspended is left as it is. The step then waits
until none of their pods is left, at most WAIT_SECONDS, and fails otherwise: the round does not
start while they may still write. Exit 75 when the Kubernetes API cannot be reached (the step
is retried).
Standard library only; runs in the infer image with the workflow ServiceAccount's token.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.parse
from typing import Any

from release_jobs import WORKFLOW_LABEL, Api, job_state, stop_running_job

RUN_ANNOTATION = "codeq.io/run"
STAGE_LABEL = "codeq.io/stage"


def writing(job: dict[str, Any]) -> bool:
    """Whether a Job may still have pods that write: unfinished and not suspended, or with pods
    still active or terminating."""
    if job_state(job)[0] != "running":
        return False
    status = job.get("status", {})
    suspended = job.get("spec", {}).get("suspend") is True
    return not suspended or bool(status.get("active")) or bool(status.get("terminating"))


def orphans(jobs: list[dict[str, Any]], run: str, workflow: str) -> list[dict[str, Any]]:
    """The stage Jobs of `run` from workflows other than `workflow` that may still write."""
    found = [
        job
        for job in jobs
        if job["metadata"].get("annotations", {}).get(RUN_ANNOTATION) == run
        and job["metadata"].get("labels", {}).get(WORKFLOW_LABEL) != workflow
        and writing(job)
    ]
    return sorted(found, key=lambda job: job["metadata"]["name"])


def stage_jobs(api: Api) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(STAGE_LABEL)
    return api.call("GET", f"{api.jobs_path()}?labelSelector={selector}").get("items", [])


def fence(api: Api, run: str, workflow: str, wait_s: float, poll_s: float) -> int:
    found = orphans(stage_jobs(api), run, workflow)
    if not found:
        print(f"no stage Job of run {run!r} from an earlier workflow is running", flush=True)
        return 0
    waiting = set()
    for job in found:
        name = job["metadata"]["name"]
        owner = job["metadata"].get("labels", {}).get(WORKFLOW_LABEL, "?")
        waiting.add(name)
        print(f"Job {name} of workflow {owner} outlived its workflow", flush=True)
        if job.get("spec", {}).get("suspend") is not True:
            # Foreground: a deleted (Kueue) Job stays listed until its pods are gone.
            print(stop_running_job(api, job, propagation="Foreground"), flush=True)
    deadline = time.monotonic() + wait_s
    while True:
        left = [j for j in stage_jobs(api) if j["metadata"]["name"] in waiting and writing(j)]
        if not left:
            print(f"{len(waiting)} Job(s) of earlier workflows of run {run!r} have no pods left")
            return 0
        if time.monotonic() >= deadline:
            names = ", ".join(j["metadata"]["name"] for j in left)
            print(
                f"error: Job(s) {names} of run {run!r} still have pods after {wait_s:.0f} s; "
                "this round does not start while they may write to the store",
                file=sys.stderr,
            )
            return 1
        time.sleep(poll_s)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    run, workflow, wait_s = argv[1], argv[2], float(argv[3])
    poll_s = float(argv[4]) if len(argv) == 5 else 5.0
    try:
        return fence(Api(), run, workflow, wait_s, poll_s)
    except urllib.error.HTTPError as exc:
        print(f"error: Kubernetes API answered {exc.code}: {exc.read()[:500]!r}", file=sys.stderr)
        return 75 if exc.code >= 500 or exc.code == 429 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"error: Kubernetes API unreachable: {exc}", file=sys.stderr)
        return 75


if __name__ == "__main__":
    sys.exit(main(sys.argv))
