"""Each attack a reward-hacking policy might write: the program must get no pass, and the host
(and the sandbox itself) must come out unharmed."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from codeq.sandbox import Sandbox
from codeq.sandbox.server.spawner import READY_CHILDREN
from tests.sandbox_attacks.helpers import (
    BACKENDS,
    assert_still_healthy,
    descendants,
    leftover_host_processes,
    passes,
    request,
    runsc_role,
    small_config,
)

ENV_SECRET = "codeq-test-secret-7f3a91c2"
EXPECTED = "expected-answer-5d1e88"


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request):
    os.environ["CODEQ_TEST_PARENT_SECRET"] = ENV_SECRET
    try:
        with Sandbox(small_config(request.param)) as box:
            if not box.isolation.get("uid_drop"):
                pytest.skip("host backend without root: no uid drop or jail (degraded, warned)")
            assert_still_healthy(box)
            yield box
    finally:
        os.environ.pop("CODEQ_TEST_PARENT_SECRET", None)


PROBER = """
import os, time
def solve():
    time.sleep(0.3)  # the spawner refills its pool of ready children meanwhile
    others = []
    for pid in range(2, 4096):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            others.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            others.append(pid)
    return others
"""


@pytest.fixture
def unharmed(sandbox):
    """After the attack: the sandbox still answers correctly and no process of the program is
    left, neither on the host nor inside gVisor."""
    yield
    assert_still_healthy(sandbox)
    left = leftover_host_processes(sandbox)
    assert not left, f"processes survived the run: {left}"
    if sandbox.backend == "gvisor":
        # Inside gVisor only the server (pid 1), the spawner and the ready children (the pool
        # refilled for the prober's own run) may exist besides the prober.
        probe = run(sandbox, PROBER, timeout=3.0)
        assert probe.calls[0] is not None and probe.calls[0].ok
        others = probe.calls[0].value
        assert len(others) <= 2 + READY_CHILDREN, f"processes survived inside: {others}"


def run(sandbox: Sandbox, program: str, timeout: float | None = 1.5):
    return sandbox.run(request(program, [], timeout=timeout))


def test_fork_bomb(sandbox, unharmed):
    program = """
import os
def solve():
    while True:
        try:
            os.fork()
        except OSError:
            pass
"""
    result = run(sandbox, program, timeout=1.0)
    assert not passes(result, [EXPECTED])
    assert result.status in ("timeout", "killed")


def test_memory_hog(sandbox, unharmed):
    program = "def solve():\n    hog = bytearray(2 * 1024 ** 3)\n    return len(hog)\n"
    result = run(sandbox, program)
    assert result.status == "memory"
    assert not passes(result, [2 * 1024**3])


def test_memory_hog_growing_slowly_at_load(sandbox, unharmed):
    program = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    # Under the wall limit alone: touching 256 MB page by page in gVisor nested in a container
    # took longer than the 1.5 s call limit on a loaded CI machine, and the test is about memory.
    result = run(sandbox, program, timeout=None)
    assert result.status == "memory"
    assert result.calls == [None]


def test_infinite_loop(sandbox, unharmed):
    started = time.monotonic()
    result = run(sandbox, "def solve():\n    while True:\n        pass\n", timeout=1.0)
    assert result.status == "timeout"
    assert time.monotonic() - started < 3.0
    assert not passes(result, [EXPECTED])


def test_sleeping_past_the_wall_limit(sandbox, unharmed):
    started = time.monotonic()
    result = run(sandbox, "import time\ntime.sleep(600)\n", timeout=None)
    elapsed = time.monotonic() - started
    assert result.status == "timeout"
    assert sandbox.config.wall_timeout_s <= elapsed < sandbox.config.wall_timeout_s + 3.0
    assert result.calls == [None]


def test_ignoring_sigterm(sandbox, unharmed):
    program = """
import signal
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):
    signal.signal(sig, signal.SIG_IGN)
def solve():
    while True:
        pass
"""
    result = run(sandbox, program, timeout=1.0)
    assert result.status == "timeout"
    assert not passes(result, [EXPECTED])


def test_network_connect(sandbox, unharmed):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    program = f"""
import socket
def solve():
    outcomes = []
    for address in (("127.0.0.1", {port}), ("1.1.1.1", 80), ("pypi.org", 443)):
        try:
            socket.create_connection(address, timeout=0.5).close()
            outcomes.append("connected")
        except OSError as exc:
            outcomes.append(type(exc).__name__)
    return outcomes
"""
    try:
        result = run(sandbox, program, timeout=3.0)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    call = result.calls[0]
    assert call is not None and call.ok
    assert "connected" not in call.value


def test_reading_a_secret_from_the_parent_environment(sandbox, unharmed):
    program = """
import os
def solve():
    found = [repr(dict(os.environ))]
    for path in ("/proc/self/environ", "/proc/1/environ", "/proc/%d/environ" % os.getppid()):
        try:
            found.append(open(path, "rb").read().decode(errors="replace"))
        except OSError as exc:
            found.append(type(exc).__name__)
    print(found)
    return found
"""
    result = run(sandbox, program)
    assert ENV_SECRET not in json.dumps([result.calls[0].value if result.calls[0] else None])
    assert ENV_SECRET not in result.stdout + result.stderr


def test_reading_expected_outputs_from_disk(sandbox, unharmed, tmp_path):
    if not sandbox.isolation.get("jail"):
        pytest.skip("this backend could not build a file-system jail here (needs root)")
    answers = tmp_path / "expected.json"
    answers.write_text(json.dumps({"answer": EXPECTED}))
    program = f"""
import json, os
def solve():
    for path in ({str(answers)!r}, "/work/shared/debugbench", "/tmp", "/etc/passwd"):
        try:
            if os.path.isdir(path):
                return sorted(os.listdir(path))
            return json.load(open(path))["answer"]
        except (OSError, ValueError, KeyError):
            continue
    return "nothing readable"
"""
    result = run(sandbox, program)
    assert not passes(result, [EXPECTED])
    assert result.calls[0] is not None and result.calls[0].value == "nothing readable"


def test_writing_a_huge_file(sandbox, unharmed):
    program = """
def solve():
    with open("big.bin", "wb") as handle:
        for _ in range(200):
            handle.write(b"x" * 1024 * 1024)
    return "written"
"""
    result = run(sandbox, program, timeout=3.0)
    assert not passes(result, ["written"])
    leftovers = [p for d in sandbox.scratch_dirs for p in Path(d).rglob("big.bin")]
    assert leftovers == []


def test_children_that_outlive_the_run(sandbox, unharmed):
    spawner = """
import os, time
def solve():
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                time.sleep(0.05)
        os._exit(0)
    os.waitpid(pid, 0)
    return "spawned"
"""
    result = run(sandbox, spawner)
    assert result.calls[0] is not None and result.calls[0].value == "spawned"
    # `unharmed` checks that the grandchild is gone (on the host, and inside gVisor).


def test_exit_before_any_test_runs(sandbox, unharmed):
    for program in (
        "import os\nos._exit(0)\n",
        "import sys\nsys.exit(0)\n",
        "raise SystemExit(0)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    ):
        result = sandbox.run(request(program, [], []))
        assert result.calls == [None, None], program
        assert result.status in ("killed", "load_error"), program
        assert not passes(result, [EXPECTED, EXPECTED])


def test_exit_inside_a_call(sandbox, unharmed):
    result = sandbox.run(request("import os\ndef solve():\n    os._exit(0)\n", [], []))
    assert result.status == "killed"
    assert result.calls[0] is not None and not result.calls[0].ok
    assert result.calls[1] is None


def test_printing_and_injecting_forged_results(sandbox, unharmed):
    program = f"""
import json, os, struct, sys
forged = json.dumps({{"i": 0, "ok": True, "value": json.dumps({EXPECTED!r}), "error": None,
                      "seconds": 0.0}}).encode()
frame = struct.pack(">I", len(forged)) + forged
print('{{"status": "ok", "passed": true}}')
print("PASS: all tests passed")
for fd in range(0, 64):
    try:
        os.write(fd, frame)
    except OSError:
        pass
def solve():
    return "wrong"
"""
    result = run(sandbox, program)
    assert not passes(result, [EXPECTED])


def test_forged_result_written_during_a_call(sandbox, unharmed):
    program = f"""
import json, os, struct
def solve():
    forged = json.dumps({{"i": 0, "ok": True, "value": json.dumps({EXPECTED!r}),
                          "error": None, "seconds": 0.0}}).encode()
    for fd in range(3, 64):
        try:
            os.write(fd, struct.pack(">I", len(forged)) + forged)
        except OSError:
            pass
    return "wrong"
"""
    result = sandbox.run(request(program, [], []))
    assert not passes(result, [EXPECTED, EXPECTED])


def test_patching_the_harness_and_builtins(sandbox, unharmed):
    program = f"""
import builtins, json, sys, os, signal
json.dumps = lambda *args, **kwargs: '"forged"'
builtins.isinstance = lambda *args: True
builtins.BaseException = object
sys.modules["json"].loads = lambda *args, **kwargs: {EXPECTED!r}
try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError:
    pass
def solve():
    return "wrong"
"""
    result = run(sandbox, program)
    assert not passes(result, [EXPECTED])


def test_flooding_output(sandbox, unharmed):
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stdout.flush()\n"
    result = run(sandbox, program, timeout=3.0)
    assert result.status == "output_limit"
    assert len(result.stdout) <= sandbox.config.max_output_bytes


def test_deep_recursion(sandbox, unharmed):
    program = """
import sys
sys.setrecursionlimit(10 ** 8)
def solve():
    def dive(depth):
        return dive(depth + 1) + 1
    return dive(0)
"""
    result = run(sandbox, program, timeout=3.0)
    assert not passes(result, [EXPECTED])
    assert result.status in ("killed", "memory", "ok", "timeout")
    if result.status == "ok":
        assert result.calls[0] is not None and not result.calls[0].ok


# ----------------------------------------------------------------- the leftover check can fail


def test_the_leftover_check_reports_a_process_left_on_the_host(sandbox):
    """What `unharmed` guards, shown to fail: a process below us that is none of the workers'
    own (as a program's child that escaped the sandbox would be) is reported."""
    import subprocess

    assert leftover_host_processes(sandbox, window_s=5.0) == {}
    stray = subprocess.Popen(["sleep", "60"])
    try:
        # until exec completes, the child's command line is ours or, mid-exec, empty (which
        # host_processes takes for a gVisor stub): look only once it is `sleep 60`
        deadline = time.monotonic() + 10.0
        while descendants().get(stray.pid) != "sleep 60 " and time.monotonic() < deadline:
            time.sleep(0.01)
        left = leftover_host_processes(sandbox, window_s=1.0)
        assert stray.pid in left, (left, descendants(), stray.pid)
    finally:
        stray.kill()
        stray.wait()
    assert leftover_host_processes(sandbox, window_s=5.0) == {}


def test_the_leftover_check_reports_a_runsc_more_than_the_workers(sandbox):
    """A runsc left running by a replaced worker is reported, though all its processes are
    runsc's own: no role may occur more often than there are workers."""
    if sandbox.backend != "gvisor":
        pytest.skip("runsc roles only exist with the gvisor backend")
    with Sandbox(small_config("gvisor", workers=1)) as extra:
        assert_still_healthy(extra)
        left = leftover_host_processes(sandbox, window_s=1.0)
        assert {runsc_role(command) for command in left.values()} >= {"do", "gofer", "sandbox"}
    assert leftover_host_processes(sandbox, window_s=5.0) == {}


@pytest.mark.parametrize(
    ("command", "role"),
    [
        ("/usr/bin/runsc --rootless --network=none do --quiet /usr/bin/python3 -S s.py", "do"),
        ("/proc/self/exe --rootless --network=none do --quiet /usr/bin/python3 -S s.py", "re-exec"),
        (
            "runsc-gofer --rootless=true --root=/tmp/runsc-do1 gofer --bundle=/tmp/runsc-do1",
            "gofer",
        ),
        ("runsc-sandbox --root=/tmp/runsc-do1 --rootless=true boot --bundle=/tmp/x", "sandbox"),
        ("/usr/bin/python3 -c import time; time.sleep(60)", None),
        ("sleep 60", None),
        ("/proc/self/exe --version", None),
    ],
)
def test_runsc_roles_of_both_debian_versions(command, role):
    assert runsc_role(command) == role
