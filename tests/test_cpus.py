"""CPUs a process may use: its cores capped by the cgroup quota (cgroup v2 and v1 layouts)."""

from __future__ import annotations

import os

from codeq.cpus import available_cpus, cgroup_cpu_quota


def test_cgroup_v2_quota_caps_the_cores_rounded_up(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.5
    assert available_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))


def test_no_quota_leaves_the_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    assert available_cpus(tmp_path) == len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path / "no-cgroup-here") == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota_and_its_no_quota_value(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    assert cgroup_cpu_quota(tmp_path) == 0.5
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(tmp_path) is None


def test_an_unreadable_quota_is_no_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroup_cpu_quota(tmp_path) is None
