"""`codeq exec`: one program against one task's tests, one JSON verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codeq import cli
from codeq.schemas import Task, read_jsonl


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Task]:
    out = tmp_path_factory.mktemp("tasks")
    assert cli.run(["prepare", "--source", "builtin", "--out", str(out)]) == 0
    path = out / "train.jsonl"
    return path, read_jsonl(path, Task)[0]


def _exec(tasks: Path, task_id: str, code: Path, *extra: str) -> int:
    return cli.run(["exec", str(tasks), "--task-id", task_id, "--code", str(code), *extra])


def test_exec_prints_one_json_verdict(prepared, tmp_path: Path, capsys) -> None:
    tasks, task = prepared
    fixed = tmp_path / "fixed.py"
    fixed.write_text(task.oracle_code)
    capsys.readouterr()
    assert _exec(tasks, task.task_id, fixed, "--json") == 0
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert verdict["passed"] is True and verdict["status"] == "passed"
    assert (
        verdict["n_passed"]
        == verdict["n_total"]
        == len(task.visible_tests) + len(task.hidden_tests)
    )
    assert verdict["backend"] in {"gvisor", "subprocess"}

    buggy = tmp_path / "buggy.py"
    buggy.write_text(task.buggy_code)
    assert _exec(tasks, task.task_id, buggy, "--tests", "hidden", "--json") == 0
    verdict = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert verdict["passed"] is False
    assert verdict["n_total"] == len(task.hidden_tests)


def test_exec_bad_input_exits_2(prepared, tmp_path: Path, capsys) -> None:
    tasks, task = prepared
    code = tmp_path / "p.py"
    code.write_text(task.oracle_code)
    assert _exec(tasks, "no-such-task", code) == 2
    assert _exec(tasks, task.task_id, tmp_path / "missing.py") == 2
    assert _exec(tasks, task.task_id, code, "--tests", "secret") == 2
    assert _exec(tmp_path / "none.jsonl", task.task_id, code) == 2
    assert capsys.readouterr().err.count("error:") == 4
