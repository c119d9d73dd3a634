"""The one install path (Makefile): everything goes into a .venv it creates, with no system pip
and no sudo-pip; `make demo` needs neither checkov nor a `codeq` on PATH; gVisor is installed
only where apt and root exist, and otherwise the fallback is announced. The real installation is
exercised by `.ci/run` (`make setup` on a fresh clone); these tests check the decisions the
Makefile makes, on machines it cannot otherwise try (no apt, an old Python)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def make(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAKEFLAGS": ""}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [str(MAKE), "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_demo_installs_into_the_venv_and_runs_its_codeq(tmp_path):
    venv = tmp_path / "venv"
    result = make("-n", "-B", "demo", f"VENV={venv}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    pip_lines = [line for line in lines if "pip install" in line]
    assert pip_lines and all(line.startswith(f"{venv}/bin/python -m pip ") for line in pip_lines)
    assert not any(line.lstrip().startswith("sudo") and "pip" in line for line in lines)
    assert "checkov" not in result.stdout, "the demo does not need the test tools"
    assert lines[-1].endswith(f"{venv}/bin/codeq rounds --rounds 2"), "not a bare `codeq` from PATH"


def test_checkov_is_installed_only_for_the_tests(tmp_path):
    result = make("-n", "-B", "setup", f"VENV={tmp_path / 'venv'}")
    assert result.returncode == 0, result.stderr
    assert "pip install -q checkov" in result.stdout
    assert ".tools/checkov" in result.stdout


def test_without_apt_the_sandbox_fallback_is_announced_and_setup_goes_on(tmp_path):
    """No runsc and no apt-get (macOS, other distributions): a note, exit 0."""
    result = make("setup-sandbox", path=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gVisor (runsc) is not installed" in result.stdout
    assert "SUBPROCESS sandbox" in result.stdout


def test_an_old_python_is_one_error_and_a_hint(tmp_path):
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\n[ "$1" = -V ] && echo "Python 3.9.2"\nexit 1\n')
    old.chmod(0o755)
    result = make("setup-python", f"PYTHON={old}", f"VENV={tmp_path / 'venv'}")
    assert result.returncode != 0
    assert f"error: CodeQ needs Python 3.11 or newer; '{old}' is Python 3.9.2" in result.stdout
    assert "hint: make setup-python PYTHON=/path/to/python3.11" in result.stdout
    assert not (tmp_path / "venv").exists()
