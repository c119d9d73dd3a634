"""Linters and scanners the tests call: found in .tools/, beside the interpreter, or on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_tool(name: str) -> str:
    local = REPO / ".tools" / name / "bin" / name
    # the interpreter's own bin/ first: `.venv/bin/python -m pytest` finds .venv's tools
    # without the PATH that `make test` sets
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = str(local) if local.exists() else shutil.which(name, path=search)
    if found:
        return found
    message = f"{name} not found in .tools/{name}/bin or on PATH (run `make setup-tools`)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
