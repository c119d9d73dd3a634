"""`codeq exec TASKS --task-id ID --code FILE [--tests visible|hidden|all] [--json]`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from codeq.commands.common import config_with
from codeq.errors import BadInputError, MissingInputError


def command(
    tasks: Path = typer.Argument(
        ..., help="Tasks file (train.jsonl or test.jsonl from `codeq prepare`).", metavar="TASKS"
    ),
    task_id: str = typer.Option(..., "--task-id", help="task_id of the task to run.", metavar="ID"),
    code: Path = typer.Option(
        ..., "--code", help="Python file with the program to run.", metavar="FILE"
    ),
    tests: Literal["visible", "hidden", "all"] = typer.Option(
        "all", "--tests", help="Which of the task's tests to run.", metavar="[visible|hidden|all]"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as one JSON line."),
) -> None:
    """Run one program against a task's tests in the sandbox."""
    from codeq.sandbox import Sandbox
    from codeq.schemas import Task, iter_jsonl
    from codeq.tasks import score_programs

    if not code.is_file():
        raise MissingInputError(f"{code} does not exist", hint="pass a Python file with --code")
    if not tasks.is_file():
        raise MissingInputError(
            f"{tasks} does not exist", hint="pass train.jsonl or test.jsonl from `codeq prepare`"
        )
    task = next((t for t in iter_jsonl(tasks, Task) if t.task_id == task_id), None)
    if task is None:
        raise BadInputError(
            f"no task {task_id!r} in {tasks}", hint="task ids are the task_id field of each line"
        )
    config = config_with()
    with Sandbox(config.sandbox) as sandbox:
        verdict = score_programs([(task, code.read_text(encoding="utf-8"))], tests, sandbox)[0]
    if as_json:
        typer.echo(verdict.model_dump_json())
        return
    typer.echo(
        f"{verdict.status}: {verdict.n_passed}/{verdict.n_total} tests passed "
        f"({verdict.backend}, {verdict.seconds:.2f}s)"
    )
    for index, outcome in enumerate(verdict.tests):
        if not outcome.passed:
            typer.echo(f"  test {index}: {outcome.status} {outcome.detail or ''}".rstrip())
