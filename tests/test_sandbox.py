"""The sandbox API: verdict statuses, per-call results, batches, backend choice, clean shutdown."""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from codeq.config import SandboxConfig
from codeq.errors import SandboxError
from codeq.sandbox import ExecRequest, Sandbox
from tests.sandbox_attacks.helpers import (
    BACKENDS,
    RUNNER,
    assert_still_healthy,
    descendants,
    passes,
    request,
    small_config,
    still_running,
)


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request):
    with Sandbox(small_config(request.param, workers=2)) as box:
        yield box


def test_runs_each_call_and_returns_raw_values(sandbox):
    program = "def solve(a, b):\n    print('working')\n    return [a + b, {'k': a}]\n"
    result = sandbox.run(request(program, [1, 2], [3, 4]))
    assert result.status == "ok"
    assert result.backend == sandbox.backend
    assert [call.value for call in result.calls if call] == [[3, {"k": 1}], [7, {"k": 3}]]
    assert "working" in result.stdout
    assert passes(result, [[3, {"k": 1}], [7, {"k": 3}]])


def test_prelude_runs_in_the_program_namespace(sandbox):
    prelude = "from collections import Counter\nBASE = 10\n"
    program = "def solve(s):\n    return BASE + Counter(s).most_common(1)[0][1]\n"
    result = sandbox.run(
        ExecRequest(
            program=program,
            runner=RUNNER,
            prelude=prelude,
            calls=[{"function": "solve", "args": ["aab"]}],
        )
    )
    assert result.status == "ok" and result.calls[0] is not None
    assert result.calls[0].value == 12


def test_a_failing_call_does_not_stop_the_next(sandbox):
    program = "def solve(x):\n    return 10 // x\n"
    result = sandbox.run(request(program, [0], [5]))
    assert result.status == "ok"
    first, second = result.calls
    assert first is not None and not first.ok and first.error.startswith("ZeroDivisionError")
    assert second is not None and second.ok and second.value == 2


def test_unserializable_return_value_fails_that_call(sandbox):
    result = sandbox.run(request("def solve():\n    return object()\n", []))
    call = result.calls[0]
    assert call is not None and not call.ok and "not JSON serializable" in call.error


def test_syntax_error_leaves_every_call_unreached(sandbox):
    result = sandbox.run(request("def solve(:\n    return 1\n", [], []))
    assert result.status == "syntax_error"
    assert result.calls == [None, None]
    assert "SyntaxError" in result.stderr


def test_exception_at_load_is_a_load_error(sandbox):
    result = sandbox.run(request("import no_such_module_here\n", []))
    assert result.status == "load_error"
    assert result.calls == [None]
    assert "ModuleNotFoundError" in result.stderr


def test_call_timeout_keeps_earlier_results_and_stops_later_calls(sandbox):
    program = "def solve(n):\n    while n:\n        pass\n    return 'done'\n"
    started = time.monotonic()
    result = sandbox.run(request(program, [0], [1], [0], timeout=0.5))
    assert time.monotonic() - started < 3.5
    assert result.status == "timeout"
    done, stuck, unreached = result.calls
    assert done is not None and done.value == "done"
    assert stuck is not None and not stuck.ok and stuck.error.startswith("TimeoutError")
    assert unreached is None
    assert_still_healthy(sandbox)


def test_batch_preserves_order_across_workers(sandbox):
    requests = [request(f"def solve():\n    return {index}\n", []) for index in range(12)]
    results = sandbox.run_batch(requests)
    assert [result.calls[0].value for result in results if result.calls[0]] == list(range(12))
    assert all(result.backend == sandbox.backend for result in results)


def test_batch_runs_in_parallel_over_workers(sandbox):
    sleeper = request("import time\ndef solve():\n    time.sleep(0.6)\n    return 1\n", [])
    started = time.monotonic()
    results = sandbox.run_batch([sleeper, sleeper, sleeper, sleeper])
    elapsed = time.monotonic() - started
    assert all(result.status == "ok" for result in results)
    assert elapsed < 4 * 0.6, f"4 sleeps on 2 workers took {elapsed:.2f}s"


def test_auto_without_runsc_falls_back_loudly(capsys, caplog):
    config = SandboxConfig(backend="auto", runsc_path="/nonexistent/runsc", workers=1)
    with Sandbox(config) as box:
        assert box.backend == "subprocess"
        assert box.run(request("def solve():\n    return 5\n", [])).backend == "subprocess"
    assert "runsc" in capsys.readouterr().err
    assert any("SUBPROCESS" in record.getMessage() for record in caplog.records)


def test_forcing_gvisor_without_runsc_is_a_sandbox_error():
    config = SandboxConfig(backend="gvisor", runsc_path="/nonexistent/runsc")
    with pytest.raises(SandboxError) as caught:
        Sandbox(config)
    assert caught.value.hint and "apt-get install runsc" in caught.value.hint


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_leaves_no_process_or_scratch_directory(backend):
    already_running = descendants()
    box = Sandbox(small_config(backend, workers=2)).start()
    spawned = "import os\ndef solve():\n    if os.fork() == 0:\n        os.setsid()\n        while True:\n            pass\n    return 1\n"
    assert box.run(request(spawned, [])).status == "ok"
    started = {pid: cmd for pid, cmd in descendants().items() if pid not in already_running}
    scratch = box.scratch_dirs
    assert len(scratch) == 2 and all(os.path.isdir(path) for path in scratch)
    assert started, "the workers should be running below this process"
    box.close()
    deadline = time.monotonic() + 5
    while still_running(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert still_running(started) == {}
    assert not any(os.path.exists(path) for path in scratch)


def test_reply_frames_need_the_runs_secret():
    import hashlib
    import hmac

    from codeq.sandbox.worker import WorkerCrashed, verify

    payload = b'{"status": null, "messages": []}'
    secret = b"s" * 32
    assert verify(payload + hmac.new(secret, payload, hashlib.sha256).digest(), secret) == {
        "status": None,
        "messages": [],
    }
    forged = payload + hmac.new(b"x" * 32, payload, hashlib.sha256).digest()
    with pytest.raises(WorkerCrashed):
        verify(forged, secret)
    with pytest.raises(WorkerCrashed):
        verify(b"short", secret)


def started_since(already_running: dict[int, str]) -> list[int]:
    """Our descendants that were not running yet: the processes of a sandbox opened since."""
    return [pid for pid in descendants() if pid not in already_running]


def group_leaders(pids: list[int]) -> list[int]:
    """The pids that lead their process group; one that exited since it was listed is skipped."""
    leaders = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                leaders.append(pid)
    return leaders


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_worker_is_replaced(backend):
    import signal

    already_running = descendants()
    with Sandbox(small_config(backend)) as box:
        assert_still_healthy(box)
        for pid in group_leaders(started_since(already_running)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        assert_still_healthy(box)
        assert_still_healthy(box)


def test_calls_that_are_not_json_are_rejected_before_running(sandbox):
    from codeq.errors import BadInputError

    bad = ExecRequest(
        program="x = 1", runner=RUNNER, calls=[{"function": "solve", "args": [{1, 2}]}]
    )
    with pytest.raises(BadInputError):
        sandbox.run(bad)
    assert_still_healthy(sandbox)


def test_scratch_left_by_a_killed_host_process_is_removed_at_next_start():
    import subprocess
    import tempfile
    from pathlib import Path

    dead = subprocess.Popen(["true"])
    dead.wait()
    abandoned = Path(tempfile.gettempdir()) / f"codeq-sandbox-{dead.pid}-abandoned"
    (abandoned / "jail").mkdir(parents=True)
    mine = Path(tempfile.mkdtemp(prefix=f"codeq-sandbox-{os.getpid()}-"))
    try:
        with Sandbox(small_config("subprocess")):
            assert not abandoned.exists()
            assert mine.exists(), "a live owner's directory must be kept"
    finally:
        mine.rmdir()


PAUSED_CLIENT = """
import sys
from codeq.sandbox import Sandbox, worker
from tests.sandbox_attacks.helpers import request, small_config

worker.REPLY_MARGIN_S = 0.2  # the host's deadline: 2.2 s after the request is sent
with Sandbox(small_config(sys.argv[1], wall_timeout_s=2.0)) as box:
    box.run(request("def solve():\\n    return 1\\n", []))  # started and warm
    print("sending", flush=True)
    result = box.run(request("import time\\ndef solve():\\n    time.sleep(1.0)\\n    return 7\\n", []))
    print(result.status, result.calls[0].value if result.calls[0] else None, flush=True)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_client_stopped_past_the_deadline_still_takes_the_reply_waiting(backend):
    """The host's deadline guards against a hung sandbox, not against this process standing
    still: a client stopped (SIGSTOP, a suspended machine) while its request ran takes the
    reply that waits in the pipe when it goes on, and the program's result stands."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    client = subprocess.Popen(
        [sys.executable, "-c", PAUSED_CLIENT, backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        assert line == "sending\n", (line, client.stderr.read() if client.stderr else "")
        time.sleep(0.3)  # the request is written; the program sleeps for 1 s in the sandbox
        client.send_signal(signal.SIGSTOP)
        time.sleep(4.0)  # past the 2.2 s deadline
        client.send_signal(signal.SIGCONT)
        out, err = client.communicate(timeout=60)
    finally:
        client.kill()
    assert client.returncode == 0, err[-2000:]
    assert out.strip() == "ok 7", (out, err[-2000:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_that_stands_still_is_given_up_at_the_deadline(backend, monkeypatch):
    """The other side of the deadline: a sandbox that gives no reply (here stopped, every
    process of it) fails that run as a sandbox error soon after the deadline, and the next run
    gets a fresh server."""
    import signal

    from codeq.sandbox import worker

    monkeypatch.setattr(worker, "REPLY_MARGIN_S", 0.2)  # deadline: 1.2 s after sending
    already_running = descendants()
    with Sandbox(small_config(backend, wall_timeout_s=1.0)) as box:
        assert_still_healthy(box)
        for pid in started_since(already_running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        result = box.run(request("def solve():\n    return 1\n", []))
        assert result.status == "sandbox_error" and "before the deadline" in result.stderr
        assert time.monotonic() - started < 1.2 + 3.0 + 5.0  # the deadline, stop's grace, slack
        assert_still_healthy(box)
