"""Ctrl-C (SIGINT) or SIGTERM during `codeq round` / `codeq rounds`: exit 130 or 143 with one
line saying what finished and the command that resumes, never exit 0 (a `codeq rounds ... &&
next-step` must not carry on after an interrupt)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codeq.cli import run
from codeq.config import load_config
from codeq.pipeline import stages

REPO = Path(__file__).resolve().parent.parent


def interrupt_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: interrupted")]
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err
    return lines[0]


def no_handler(signum: int, frame: object) -> None:
    raise AssertionError(f"signal {signum} reached no handler of codeq's")


@pytest.fixture(autouse=True)
def sigterm_not_fatal():
    """SIGTERM without codeq's handler would end pytest itself; here it fails the test."""
    previous = signal.signal(signal.SIGTERM, no_handler)
    yield
    signal.signal(signal.SIGTERM, previous)


def stub_stages(monkeypatch, stop_in: str, signum: int) -> None:
    """Every stage returns at once, except `stop_in`, which gets a real signal mid-way."""

    def finished(context, **arguments):
        return {"skipped": False}

    def stopped(context, **arguments):
        os.kill(os.getpid(), signum)
        time.sleep(5)
        raise AssertionError("the signal never arrived")

    for name in stages.STAGE_FUNCTIONS:
        monkeypatch.setitem(stages.STAGE_FUNCTIONS, name, stopped if name == stop_in else finished)


@pytest.mark.parametrize(
    ("stop_in", "signum", "code", "finished"),
    [
        ("collect", signal.SIGINT, 130, "prepare"),
        ("train", signal.SIGTERM, 143, "prepare, collect, verifier, pairs"),
    ],
)
def test_a_signal_in_a_round_exits_non_zero_with_one_line(
    tmp_path, monkeypatch, capsys, stop_in, signum, code, finished
):
    stub_stages(monkeypatch, stop_in, signum)
    argv = ["round", "-o", str(tmp_path / "out")]
    sigint_before = signal.getsignal(
        signal.SIGINT
    )  # SIG_IGN where a shell started us in the background
    assert run(argv) == code
    line = interrupt_line(capsys.readouterr().err)
    name = signal.Signals(signum).name
    ran = stages.round_stages(load_config(None))  # the learned verifier's stage among them
    index = ran.index(stop_in) + 1
    assert line == (
        f"error: interrupted ({name}): round 0 stopped in {stop_in} (stage {index}/{len(ran)}) after "
        f"{finished} finished; to resume, run the same command again: codeq round -o "
        f"{tmp_path / 'out'} (finished stages are skipped; collect and evaluate keep the tasks "
        "they finished)"
    )
    # the handlers are the process's own again
    assert signal.getsignal(signal.SIGTERM) is no_handler
    assert signal.getsignal(signal.SIGINT) is sigint_before


def test_a_signal_that_library_code_turns_into_another_error_is_still_an_interrupt(
    tmp_path, monkeypatch, capsys
):
    """Raised inside a lock's release, the KeyboardInterrupt can come out as a RuntimeError: the
    command still exits 130, not 1 with "this is a bug in codeq"."""

    def cut_inside_a_lock(context, **arguments):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock") from None

    stub_stages(monkeypatch, "collect", signal.SIGINT)
    monkeypatch.setitem(stages.STAGE_FUNCTIONS, "collect", cut_inside_a_lock)
    assert run(["rounds", "--rounds", "2", "-o", str(tmp_path / "out")]) == 130
    line = interrupt_line(capsys.readouterr().err)
    assert "round 0 stopped in collect (stage 2/8) after prepare finished" in line
    assert "codeq rounds --rounds 2 -o" in line


# ------------------------------------------------------------------------------ real signals


def wait_for(pattern: str, log: Path, proc: subprocess.Popen, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if re.search(pattern, log.read_text(errors="replace"), re.MULTILINE):
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} early:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared:\n{log.read_text()[-3000:]}")


def start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """`codeq ...` in its own process group, as a shell runs a foreground command: with SIGINT
    at its default even where the suite itself was started in the background (where a shell
    ignores SIGINT for it, and Python then installs no KeyboardInterrupt handler)."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "codeq", *argv],
            stdout=out,
            stderr=out,
            env=env,
            cwd=REPO,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def stop(proc: subprocess.Popen, signum: int, log: Path) -> tuple[int, str]:
    """Signal the whole process group (what Ctrl-C in a terminal does) and wait for the exit."""
    os.killpg(proc.pid, signum)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"no exit 120 s after {signum}:\n{log.read_text()[-3000:]}") from None
    return code, log.read_text(errors="replace")


@pytest.mark.slow
def test_ctrl_c_in_collect_and_sigterm_in_train_of_a_real_round_then_a_rerun_resumes(
    tmp_path, smollm2_dir
):
    """`codeq round` with SmolLM2 (the laptop preset): SIGINT to its process group once collect
    has saved a task, SIGTERM once train has started; each exits non-zero with its line, and
    each rerun resumes (collect restores the saved tasks; the finished stages are skipped)."""
    out = tmp_path / "out"
    # one task at a time, so SIGINT lands mid-collect; every gap a pair, so train has pairs to
    # train on; two tasks each for evaluate and promotion (the rerun's last stages are not what
    # this test is about, and all the validation tasks cost a minute and a half); one DPO step
    # (the rerun's training is not what it is about either); the verifier reads 256 tokens,
    # the builtin tasks' programs whole
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        "search:\n  parallel_trees: 1\npairs:\n  min_value_gap: 0.0\n"
        "train:\n  max_steps: 1\nverifier:\n  max_length: 256\n"
        "evaluate:\n  max_tasks: 2\npromotion:\n  max_tasks: 2\n"
    )
    argv = ["round", "-c", str(settings), "-o", str(out), "--model", str(smollm2_dir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    saved = out / "store" / "runs" / "local" / "round-0" / "trajectories" / "shard-0" / "tasks"

    log = tmp_path / "first.log"
    proc = start(argv, log, env)
    deadline = time.monotonic() + 900
    while not (saved.is_dir() and any(saved.iterdir())):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "collect never saved a task"
        time.sleep(0.2)
    code, text = stop(proc, signal.SIGINT, log)
    assert code == 130, text[-3000:]
    line = interrupt_line(text)
    assert "round 0 stopped in collect (stage 2/8) after prepare finished" in line
    assert f"codeq {' '.join(argv)}" in line
    assert not (saved.parent / "_COMPLETE").exists()

    log = tmp_path / "second.log"
    proc = start(argv, log, env)
    wait_for(r"train: DPO with LoRA on \d+ pairs", log, proc)
    code, text = stop(proc, signal.SIGTERM, log)
    assert code == 143, text[-3000:]
    assert "prepare: already complete" in text
    restored = re.search(r"collect shard 0/1: (\d+) task\(s\) restored", text)
    assert restored and int(restored.group(1)) >= 1, text[-3000:]
    line = interrupt_line(text)
    assert (
        "round 0 stopped in train (stage 5/8) after prepare, collect, verifier, pairs finished"
        in line
    )

    rerun = subprocess.run(
        [sys.executable, "-m", "codeq", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=1800,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for stage in ("prepare", "collect shard 0", "pairs"):
        assert f"{stage}: already complete" in rerun.stderr
    assert rerun.stdout.strip().startswith("report: ")
