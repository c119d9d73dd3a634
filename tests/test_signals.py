"""SIGTERM reaches a running stage and stops it cleanly.

Kubernetes stops a container (preemption, node drain, the Job suspended by Kueue or by the
round's exit handler) by sending SIGTERM to its PID 1, then SIGKILL after the grace period. The
chart starts stages through the image's entrypoint (`args`, no `command`), which `exec`s python,
so python is PID 1 of the container unless an init (tini) runs in front of it; a PID 1 without a
SIGTERM handler never sees the signal. These tests run the stage exactly that way: through
`images/entrypoint.sh`, once as PID 1 of a fresh PID namespace (`unshare`) and once as an ordinary
process, signal it while its sandbox workers run, and check what it leaves behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.sandbox_attacks.helpers import descendants, still_running

REPO = Path(__file__).resolve().parent.parent
ENTRYPOINT = REPO / "images" / "entrypoint.sh"
TASKS_PREFIX = Path("runs/default/round-0/tasks")
SIGTERM_EXIT = 128 + signal.SIGTERM
# The stop must finish before the kubelet's SIGKILL: within the grace period the chart gives.
GRACE_S = yaml.safe_load((REPO / "helm" / "codeq" / "values.yaml").read_text())["jobs"][
    "terminationGracePeriodSeconds"
]


def pid_namespace_prefix() -> list[str]:
    """`unshare` arguments that make the next command PID 1 of a new PID namespace."""
    command = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run([*command, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a user+PID namespace here: {probe.stderr.strip()[:200]}")
    return command


def stage_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEQ_", "JOB_COMPLETION"))}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "CODEQ_STORE__URI": f"file://{tmp_path / 'store'}",
            "CODEQ_TASKS__SOURCE": "builtin",
            "CODEQ_SANDBOX__BACKEND": "auto",
            # the entrypoint creates these; keep them out of the host's /scratch
            "CODEQ_SCRATCH_DIR": str(tmp_path / "scratch"),
            "XDG_CACHE_HOME": str(tmp_path / "scratch" / "cache"),
            "TMPDIR": str(tmp_path / "tmp"),
            "PYTHONUNBUFFERED": "1",
            # A stop that hangs is aborted with SIGABRT, which then prints every thread's stack.
            "PYTHONFAULTHANDLER": "1",
        }
    )
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def stage_process(proc: subprocess.Popen, wrapped: bool) -> int:
    """PID of python itself: the launcher's pid, or its forked child inside the namespace."""
    if not wrapped:
        return proc.pid
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid, command in descendants(proc.pid).items():
            if "jobs.prepare" in command and "entrypoint" not in command:
                return pid
        time.sleep(0.05)
    raise AssertionError("the stage process did not start inside the namespace")


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text(errors="replace")):
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"stage exited {proc.returncode} early:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} never appeared:\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize("as_pid_1", [True, False], ids=["python-is-pid-1", "python-is-a-child"])
def test_sigterm_stops_a_running_stage_cleanly_and_a_rerun_finishes_it(tmp_path, as_pid_1):
    prefix = pid_namespace_prefix() if as_pid_1 else []
    env = stage_env(tmp_path)
    log = tmp_path / "stage.log"
    command = [*prefix, "sh", str(ENTRYPOINT), sys.executable, "-m", "jobs.prepare"]
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=out, stderr=out)
    try:
        python = stage_process(proc, wrapped=bool(prefix))
        # The sandbox's workers are up: the stage is mid-way, running programs.
        wait_for(log, r"sandbox: \d+ \w+ workers", proc)
        workers = {p: c for p, c in descendants(python).items()}
        assert workers, "expected sandbox worker processes below the stage"
        os.kill(python, signal.SIGTERM)
        signalled = time.monotonic()
        try:
            code = proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.kill(python, signal.SIGABRT)
            time.sleep(2)
            pytest.fail(
                f"no exit {GRACE_S}s after SIGTERM:\n{log.read_text(errors='replace')[-6000:]}"
            )
        stop_s = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert code == SIGTERM_EXIT, f"exit {code}; the stage did not stop on SIGTERM:\n{text[-3000:]}"
    assert "job prepare terminated (SIGTERM)" in text
    assert "prepare: done" not in text
    print(f"stopped {stop_s:.1f}s after SIGTERM")

    store = tmp_path / "store"
    assert not (store / TASKS_PREFIX / "_COMPLETE").exists(), "unfinished output marked complete"
    assert not list(store.rglob("*.tmp")), "half-written objects left in the store"
    assert not list((tmp_path / "scratch").glob("codeq-prepare-*")), "scratch folder left behind"
    deadline = time.monotonic() + 5
    while still_running(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert still_running(workers) == {}, "sandbox workers outlived the stage"

    rerun = subprocess.run(
        ["sh", str(ENTRYPOINT), sys.executable, "-m", "jobs.prepare"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (store / TASKS_PREFIX / "_COMPLETE").is_file()


def test_sigterm_that_library_code_turns_into_another_error_still_exits_as_terminated(
    tmp_path, monkeypatch
):
    """The handler raises wherever the main thread is; inside a lock's release (a thread
    pool's submit) the unwinding can replace StageTerminated with a RuntimeError. The job still
    exits 143 (a rerun resumes it), not 1 with "this is a bug in codeq"."""
    from codeq.pipeline.stages import STAGE_FUNCTIONS
    from jobs import _runner

    def stage_cut_inside_a_lock(context, **arguments):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except _runner.StageTerminated:
            raise RuntimeError("release unlocked lock") from None
        raise AssertionError("SIGTERM never arrived")

    for key, value in stage_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "scratch").mkdir()  # the entrypoint's job
    monkeypatch.setitem(STAGE_FUNCTIONS, "prepare", stage_cut_inside_a_lock)
    monkeypatch.setattr(_runner, "_terminated_by", [])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        _runner.install_sigterm_handler()
        assert _runner.run_stage("prepare") == SIGTERM_EXIT
    finally:
        signal.signal(signal.SIGTERM, previous)

    def stage_with_a_real_bug(context, **arguments):
        raise RuntimeError("release unlocked lock")

    monkeypatch.setattr(_runner, "_terminated_by", [])
    monkeypatch.setitem(STAGE_FUNCTIONS, "prepare", stage_with_a_real_bug)
    assert _runner.run_stage("prepare") == 1  # without SIGTERM the same error is a bug
