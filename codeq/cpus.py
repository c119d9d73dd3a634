"""How many CPUs this process may use: the cores it may run on, capped by its cgroup's CPU quota.

A pod with `limits.cpu: 2` on a 96-core node sees 96 cores; torch (one thread per core) and a
pool of one sandbox worker per core would then run 96 threads in 2 CPUs' time, and the kernel
throttles them all. Kubernetes and Docker set the quota in cgroup v2's `cpu.max` (v1:
`cpu.cfs_quota_us` / `cpu.cfs_period_us`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup's quota allows (e.g. 1.5), or None without a quota."""
    v2 = root / "cpu.max"
    try:
        if v2.is_file():
            limit, period = v2.read_text().split()[:2]
            return None if limit == "max" else int(limit) / int(period)
        v1 = root / "cpu" / "cpu.cfs_quota_us"
        if v1.is_file():
            microseconds = int(v1.read_text())  # -1: no quota
            period_v1 = int((root / "cpu" / "cpu.cfs_period_us").read_text())
            return None if microseconds <= 0 else microseconds / period_v1
    except (OSError, ValueError):
        return None
    return None


def available_cpus(root: Path = CGROUP) -> int:
    """The cores this process may run on, capped by the cgroup quota rounded up; at least 1."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)
