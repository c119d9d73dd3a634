"""`codeq prepare`: usable tasks only, hidden tests from the oracle, split by problem slug."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from codeq import cli
from codeq.config import load_config
from codeq.schemas import Task, read_jsonl
from codeq.tasks import score_programs, split_by_slug
from codeq.tasks.pipeline import SPLITS, call_timeout_for


@pytest.fixture(scope="module")
def sandbox() -> Iterator[object]:
    from codeq.sandbox import Sandbox

    with Sandbox(load_config().sandbox) as running:
        yield running


def _prepare(source: str, out: Path, *extra: str) -> dict:
    assert cli.run(["prepare", "--source", source, "--out", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text())


def _check_usable(tasks: list[Task], sandbox, hidden_per_task: int = 5) -> None:
    """The definition of usable: oracle passes every test, buggy code fails at least one."""
    for task in tasks:
        assert len(task.hidden_tests) >= hidden_per_task
        assert all(test.origin == "generated" for test in task.hidden_tests)
        assert len(task.visible_tests) == len(task.examples)
        visible_inputs = {json.dumps(t.call, sort_keys=True) for t in task.visible_tests}
        assert not visible_inputs & {json.dumps(t.call, sort_keys=True) for t in task.hidden_tests}
    oracle = score_programs([(task, task.oracle_code) for task in tasks], "all", sandbox)
    buggy = score_programs([(task, task.buggy_code) for task in tasks], "all", sandbox)
    assert all(v.passed for v in oracle), [
        t.slug for t, v in zip(tasks, oracle, strict=True) if not v.passed
    ]
    assert not any(v.passed for v in buggy)


def _splits(out: Path) -> tuple[list[Task], list[Task], list[Task]]:
    return tuple(read_jsonl(out / f"{name}.jsonl", Task) for name in SPLITS)  # type: ignore[return-value]


def test_builtin_prepare_is_usable_split_and_deterministic(tmp_path: Path, sandbox) -> None:
    report = _prepare("builtin", tmp_path / "a")
    train, validation, test = _splits(tmp_path / "a")
    usable = len(train) + len(validation) + len(test)
    assert report["usable"] == usable == report["unique"] - report["dropped"]
    assert report["usable"] >= 14
    assert test and validation and train
    slugs = [{t.slug for t in split} for split in (train, validation, test)]
    assert not slugs[0] & slugs[1] and not slugs[0] & slugs[2] and not slugs[1] & slugs[2]
    assert report["test"]["slugs"] == sorted(slugs[2])
    assert report["validation"]["slugs"] == sorted(slugs[1])
    assert set(report["by_category"]) == {"syntax", "reference", "logic", "multiple"}
    assert sum(report["by_level"].values()) == report["usable"]
    _check_usable(train + validation + test, sandbox)
    _prepare("builtin", tmp_path / "b")
    for name in SPLITS:  # all but each task's call time limit, which is measured (20x its
        # slowest oracle call, in steps of 1, 2, 4 ... s) and so moves with the machine's load
        first, second = (_untimed(tmp_path / run / f"{name}.jsonl") for run in ("a", "b"))
        assert first == second


def _untimed(path: Path) -> list[dict]:
    tasks = [json.loads(line) for line in path.read_text().splitlines()]
    for task in tasks:
        # a loaded machine (CI's other worker) can take a builtin oracle call past 0.1 s
        assert task["entry"].pop("call_timeout_s") in (1.0, 2.0, 4.0, 8.0, 10.0)
    return tasks


@pytest.mark.parametrize(
    ("slowest", "limit"),
    [(0.001, 1.0), (0.049, 1.0), (0.06, 2.0), (0.11, 4.0), (0.3, 8.0), (1.9, 10.0)],
)
def test_call_timeout_is_20x_the_slowest_oracle_call_in_coarse_steps(slowest, limit):
    assert call_timeout_for(slowest, cap_s=10.0) == limit


def test_call_timeout_never_exceeds_the_oracle_limit():
    assert call_timeout_for(0.001, cap_s=0.5) == 0.5


def _fake_tasks(n_slugs: int, per_slug: int = 3) -> list[Task]:
    base = read_jsonl_builtin_one()
    return [
        base.model_copy(update={"slug": f"slug-{s}", "task_id": f"{s:08d}{i:08d}"})
        for s in range(n_slugs)
        for i in range(per_slug)
    ]


_ONE: list[Task] = []


def read_jsonl_builtin_one() -> Task:
    if not _ONE:
        _ONE.append(
            Task(
                task_id="0" * 16,
                slug="x",
                level="easy",
                category="logic",
                subtype="other error",
                description="",
                examples=[],
                buggy_code="",
                oracle_code="",
                visible_tests=[],
                hidden_tests=[],
            )
        )
    return _ONE[0]


@pytest.mark.parametrize(
    ("n_slugs", "test_fraction", "validation_fraction"),
    [(2, 0.15, 0.0), (3, 0.15, 0.15), (13, 0.15, 0.15), (100, 0.15, 0.15), (100, 0.5, 0.2)],
)
def test_split_by_slug_is_disjoint_and_seeded(
    n_slugs: int, test_fraction: float, validation_fraction: float
) -> None:
    tasks = _fake_tasks(n_slugs)
    splits = split_by_slug(tasks, 42, test_fraction, validation_fraction)
    train, validation, test = ({t.slug for t in split} for split in splits)
    assert not train & validation and not train & test and not validation & test
    assert train | validation | test == {t.slug for t in tasks}
    assert train
    assert len(test) == max(1, round(test_fraction * n_slugs))
    expected_validation = max(1, round(validation_fraction * (n_slugs - len(test))))
    assert len(validation) == (expected_validation if validation_fraction else 0)
    assert split_by_slug(tasks, 42, test_fraction, validation_fraction) == splits
    if n_slugs >= 13:
        other = split_by_slug(tasks, 7, test_fraction, validation_fraction)
        assert {t.slug for t in other[2]} != test
        assert {t.slug for t in other[1]} != validation


def test_prepare_bad_source_exits_2(tmp_path: Path, capsys) -> None:
    assert (
        cli.run(["prepare", "--source", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    )
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "o" / "train.jsonl").exists()


def _sample_clone(debugbench_dir: Path, root: Path, keep_one_in: int, seed: int) -> Path:
    """A clone holding a seeded sample of the local items (never committed)."""
    rng = random.Random(seed)
    benchmark = root / "benchmark"
    benchmark.mkdir(parents=True)
    for path in sorted(debugbench_dir.glob("python3_*.json")):
        items = json.loads(path.read_text())
        kept = [item for item in items if rng.randrange(keep_one_in) == 0]
        (benchmark / path.name).write_text(json.dumps(kept))
    return root


@pytest.mark.slow
def test_debugbench_sample_is_mostly_usable(debugbench_dir: Path, tmp_path: Path, sandbox) -> None:
    clone = _sample_clone(debugbench_dir, tmp_path / "clone", keep_one_in=6, seed=3)
    out = tmp_path / "tasks"
    report = _prepare(str(clone), out, "--seed", "5", "--test-fraction", "0.2")
    train, validation, test = _splits(out)
    assert report["usable_fraction"] >= 0.85, report["dropped_by_reason"]
    assert report["dropped"] == sum(report["dropped_by_reason"].values())
    assert report["unique"] == report["usable"] + report["dropped"]
    assert validation and test
    slugs = [{t.slug for t in split} for split in (train, validation, test)]
    assert not slugs[0] & slugs[1] and not slugs[0] & slugs[2] and not slugs[1] & slugs[2]
    per_category = defaultdict(int)
    for task in train + validation + test:
        per_category[task.category] += 1
    assert per_category == report["by_category"]
    _check_usable(train + validation + test, sandbox)
