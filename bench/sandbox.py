"""Sandbox speed, measured in one run: the default (warm, isolated) backend against a bare
`python3 -S -c pass` start and against one `runsc do` per run.

Latency is the median time of one run on a warm, otherwise idle sandbox: bare python and the
sandbox are timed the same way, one run every --gap seconds (the sandbox forks its next child and
cleans up the last run in the background, as it would between a search's batches). Back-to-back
time per run, with no pause between runs, is printed beside it: on 2 cores it is bound by the
CPU that gVisor spends forking and tearing down a process for every run.

Prints median latency and executions per second for each, the default backend with 1 and 2
workers, and the ratios the issue asks for:
  latency ratio  default / bare python      (target: <= 2x)
  speed-up       runsc-do-per-run / default (several times)
  scaling        exec/s with 2 workers / with 1 worker

Usage: python bench/sandbox.py [--runs 40] [--gap 0.05] [--backend auto|gvisor|subprocess]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from codeq.config import SandboxConfig
from codeq.sandbox import ExecRequest, Sandbox

RUNNER = """
def run_call(namespace, call):
    return namespace["Solution"]().twoSum(*call["args"])
"""
PROGRAM = """
from typing import List
class Solution:
    def twoSum(self, nums: List[int], target: int) -> List[int]:
        seen = {}
        for index, value in enumerate(nums):
            if target - value in seen:
                return [seen[target - value], index]
            seen[value] = index
        return []
"""
CALLS = [{"args": [[2, 7, 11, 15], 9]}, {"args": [[3, 2, 4], 6]}, {"args": [[3, 3], 6]}]
REQUEST = ExecRequest(program=PROGRAM, runner=RUNNER, calls=CALLS, call_timeout_s=5.0)
STANDALONE = f"{PROGRAM}\nfor a in {CALLS!r}:\n    print(Solution().twoSum(*a['args']))\n"


def timed(action: Callable[[], object], runs: int, gap: float = 0.0) -> list[float]:
    action()  # warm-up (page cache, first fork)
    latencies = []
    for _ in range(runs):
        time.sleep(gap)
        started = time.perf_counter()
        action()
        latencies.append(time.perf_counter() - started)
    return latencies


def bare_python() -> None:
    subprocess.run([sys.executable, "-S", "-c", "pass"], check=True, env={})


def runsc_do(runsc: str) -> Callable[[], None]:
    def once() -> None:
        command = [runsc, "--rootless", "--network=none", "do", "--quiet"]
        subprocess.run(
            [*command, os.path.realpath(sys.executable), "-S", "-c", STANDALONE],
            check=True,
            env={"PATH": "/usr/bin:/bin"},
            stdout=subprocess.DEVNULL,
        )

    return once


def sandbox_numbers(backend: str, workers: int, runs: int, gap: float) -> dict[str, float]:
    with Sandbox(SandboxConfig(backend=backend, workers=workers)) as sandbox:  # type: ignore[arg-type]

        def one() -> None:
            result = sandbox.run(REQUEST)
            assert result.status == "ok" and result.calls[0] is not None
            assert result.calls[0].value == [0, 1], result

        latencies = timed(one, runs, gap)
        back_to_back = timed(one, runs)
        batch = [REQUEST] * (runs * 2)
        started = time.perf_counter()
        results = sandbox.run_batch(batch)
        elapsed = time.perf_counter() - started
        assert all(result.status == "ok" for result in results)
        return {
            "median_ms": statistics.median(latencies) * 1000,
            "back_to_back_ms": statistics.median(back_to_back) * 1000,
            "exec_per_s": len(batch) / elapsed,
            "backend": sandbox.backend,  # type: ignore[dict-item]
        }


def summarize(latencies: list[float], back_to_back: list[float]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(latencies) * 1000,
        "back_to_back_ms": statistics.median(back_to_back) * 1000,
        "exec_per_s": 1.0 / statistics.mean(back_to_back),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between timed runs")
    parser.add_argument("--backend", default="auto", choices=["auto", "gvisor", "subprocess"])
    args = parser.parse_args()

    rows: dict[str, dict] = {}
    bare_runs = timed(bare_python, args.runs, args.gap), timed(bare_python, args.runs)
    rows["bare python3 -S -c pass"] = summarize(*bare_runs)
    runsc = shutil.which("runsc")
    if runsc:
        do_runs = timed(runsc_do(runsc), max(5, args.runs // 4), args.gap)
        rows["runsc do per run"] = summarize(do_runs, do_runs)
    one = sandbox_numbers(args.backend, 1, args.runs, args.gap)
    two = sandbox_numbers(args.backend, 2, args.runs, args.gap)
    backend = one.pop("backend")
    two.pop("backend")
    rows[f"sandbox {backend}, 1 worker"] = one
    rows[f"sandbox {backend}, 2 workers"] = two

    print(f"{'':34} {'latency ms':>10} {'back-to-back ms':>16} {'exec/s':>9}")
    for name, row in rows.items():
        print(
            f"{name:34} {row['median_ms']:10.1f} {row['back_to_back_ms']:16.1f} "
            f"{row['exec_per_s']:9.1f}"
        )
    bare = rows["bare python3 -S -c pass"]
    ratios = {
        "latency_vs_bare_python": one["median_ms"] / bare["median_ms"],
        "back_to_back_vs_bare_python": one["back_to_back_ms"] / bare["back_to_back_ms"],
        "throughput_2_workers_vs_1": two["exec_per_s"] / one["exec_per_s"],
    }
    if "runsc do per run" in rows:
        ratios["runsc_do_latency_vs_sandbox"] = (
            rows["runsc do per run"]["median_ms"] / one["median_ms"]
        )
    print(
        f"latency, sandbox / bare python start: {ratios['latency_vs_bare_python']:.2f}x (target <= 2x)"
    )
    print(
        "back-to-back time per run, sandbox / bare python start: "
        f"{ratios['back_to_back_vs_bare_python']:.2f}x"
    )
    if "runsc_do_latency_vs_sandbox" in ratios:
        print(
            f"latency, one runsc do per run / sandbox: {ratios['runsc_do_latency_vs_sandbox']:.1f}x faster"
        )
    print(f"throughput, 2 workers / 1 worker: {ratios['throughput_2_workers_vs_1']:.2f}x")
    print(json.dumps({"backend": backend, "rows": rows, "ratios": ratios, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
