"""`codeq prepare`: DebugBench items -> executable tasks with visible and hidden tests, split by
problem slug. Every dropped item is counted under a named reason in report.json."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tqdm import tqdm

from codeq.config import CodeQConfig
from codeq.errors import DatasetError
from codeq.schemas import Task, TestCase, write_json, write_jsonl
from codeq.tasks.harness import EntryError, detect_entry, make_call
from codeq.tasks.literals import LiteralParseError, ParsedExample, parse_example
from codeq.tasks.loaders import RawItem, code_hash, deduplicate, load_source, normalize_code
from codeq.tasks.scoring import build_request, verdict_from_result
from codeq.tasks.synth import Mutator

if TYPE_CHECKING:
    from codeq.sandbox import ExecResult, Sandbox

log = logging.getLogger(__name__)
ORACLE_CALL_TIMEOUT_S = 2.0
MIN_CALL_TIMEOUT_S = 1.0  # per-call limit of a task: 20x its slowest oracle call, at least this
CANDIDATE_FACTOR = 3  # candidates synthesized per wanted hidden test (the oracle rejects some)
# Hidden tests kept: at least tasks.hidden_tests_per_task, up to this many times it; more inputs
# catch more of the subtle bugs (calls cost milliseconds each).
HIDDEN_KEEP_FACTOR = 2
BATCH = 32
T = TypeVar("T")


@dataclass
class Draft:
    item: RawItem
    task_id: str
    entry: dict[str, Any]
    visible: list[TestCase]


@dataclass
class Group:
    """Items that share an oracle and examples: their hidden tests are built once."""

    key: str
    oracle: str
    examples: list[ParsedExample]
    entry: dict[str, Any]
    visible: list[TestCase]
    constraints: str
    drafts: list[Draft] = field(default_factory=list)
    call_timeout_s: float = ORACLE_CALL_TIMEOUT_S
    candidates: list[dict[str, Any]] = field(default_factory=list)
    hidden: list[TestCase] = field(default_factory=list)


def _check_options(item: RawItem) -> dict[str, Any]:
    text = (item.description + "\n" + "\n".join(item.examples)).lower()
    check: dict[str, Any] = {"float_tolerance": 1e-5}
    if "any order" in text or "order of the elements may be changed" in text:
        check["unordered"] = True
    return check


def draft_tests(item: RawItem) -> tuple[dict[str, Any], list[ParsedExample], list[TestCase]]:
    """Entry point, parsed examples and visible tests of one item (no execution)."""
    if not item.examples:
        raise LiteralParseError("the statement has no examples")
    parsed = [parse_example(text) for text in item.examples]
    entry = detect_entry(item.oracle_code, parsed[0])
    check = _check_options(item)
    if entry.get("k_prefix"):
        check["k_prefix"] = True
    tests = [
        TestCase(
            call=make_call(entry, example), expected=example.output, check=check, origin="example"
        )
        for example in parsed
    ]
    return entry, parsed, tests


def _group_key(item: RawItem, visible: list[TestCase]) -> str:
    payload = normalize_code(item.oracle_code) + json.dumps(
        [t.call for t in visible], sort_keys=True
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def build_groups(items: Sequence[RawItem], drops: Counter[str]) -> list[Group]:
    groups: dict[str, Group] = {}
    for item in items:
        try:
            entry, parsed, visible = draft_tests(item)
        except LiteralParseError:
            drops["unparseable_examples"] += 1
            continue
        except EntryError as exc:
            reason = "unsupported_input_type" if "not supported" in str(exc) else "no_entry_point"
            drops[reason] += 1
            continue
        key = _group_key(item, visible)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(
                key=key,
                oracle=item.oracle_code,
                examples=parsed,
                entry=entry,
                visible=visible,
                constraints=item.constraints,
            )
        group.drafts.append(Draft(item, code_hash(item.buggy_code)[:16], entry, visible))
    return list(groups.values())


def synthesize_candidates(group: Group, config: CodeQConfig) -> None:
    rng = random.Random(f"{config.tasks.seed}:{group.drafts[0].item.slug}:{group.key}")
    mutator = Mutator(group.examples, group.constraints, rng)
    wanted = config.tasks.hidden_tests_per_task * CANDIDATE_FACTOR
    calls = []
    for candidate in mutator.candidates(wanted, config.tasks.mutation_attempts):
        try:
            calls.append(make_call(group.entry, candidate))
        except EntryError:
            continue
    group.candidates = calls


def synthesize_all(groups: list[Group], config: CodeQConfig) -> int:
    """Candidate hidden inputs for every group; returns how many were made."""
    for group in groups:
        synthesize_candidates(group, config)
    return sum(len(group.candidates) for group in groups)


def _chunked_batch(
    sandbox: Sandbox, requests: list[Any], label: str, progress: bool
) -> list[ExecResult]:
    results: list[ExecResult] = []
    with tqdm(total=len(requests), desc=label, unit="run", disable=not progress) as bar:
        for start in range(0, len(requests), BATCH):
            chunk = requests[start : start + BATCH]
            results.extend(sandbox.run_batch(chunk))
            bar.update(len(chunk))
    return results


def run_oracles(
    groups: list[Group], sandbox: Sandbox, config: CodeQConfig, drops: Counter[str], progress: bool
) -> list[Group]:
    """Run each oracle once over its examples and all candidates; keep the inputs it answers."""
    timeout = min(ORACLE_CALL_TIMEOUT_S, config.tasks.oracle_timeout_s)
    requests = [
        build_request(
            group.oracle,
            group.visible
            + [TestCase(call=c, expected=None, origin="generated") for c in group.candidates],
            timeout,
        )
        for group in groups
    ]
    results = _chunked_batch(sandbox, requests, "oracle", progress)
    kept: list[Group] = []
    wanted = config.tasks.hidden_tests_per_task
    for group, result in zip(groups, results, strict=True):
        n_visible = len(group.visible)
        visible_run = _slice_result(result, 0, n_visible)
        verdict = verdict_from_result(visible_run, group.visible)
        if not verdict.passed:
            reason = _oracle_drop_reason(verdict.status, group.drafts[0].item)
            drops[reason] += len(group.drafts)
            continue
        check = group.visible[0].check
        hidden = [
            TestCase(
                call=call, expected=_expected(outcome.value, check), check=check, origin="generated"
            )
            for call, outcome in zip(group.candidates, result.calls[n_visible:], strict=False)
            if outcome is not None and outcome.ok
        ]
        if len(hidden) < wanted:
            drops["too_few_hidden_tests"] += len(group.drafts)
            continue
        group.hidden = hidden[: wanted * HIDDEN_KEEP_FACTOR]
        slowest = max(call.seconds for call in result.calls if call is not None)
        group.call_timeout_s = call_timeout_for(slowest, config.tasks.oracle_timeout_s)
        kept.append(group)
    return kept


def call_timeout_for(slowest_oracle_call_s: float, cap_s: float) -> float:
    """A task's per-call limit: 20x its slowest oracle call, at least MIN_CALL_TIMEOUT_S, rounded
    up to a power of two times that and capped. The coarse steps keep the value (and so the task
    files) the same from one prepare to the next unless the oracle's time changes by a lot."""
    limit = MIN_CALL_TIMEOUT_S
    while limit < 20 * slowest_oracle_call_s and limit < cap_s:
        limit *= 2
    return min(cap_s, limit)


def _expected(value: Any, check: dict[str, Any]) -> Any:
    """The oracle's result as a test expects it (k-prefix results keep only nums[:k])."""
    if check.get("k_prefix") and isinstance(value, list) and len(value) == 2:
        k, nums = value
        if isinstance(k, int) and isinstance(nums, list):
            return [k, nums[:k]]
    return value


_ANY_ANSWER = re.compile(
    r"\b(return|output|print) any\b|any (valid|possible|one of)|multiple (valid )?answers", re.I
)


def _oracle_drop_reason(status: str, item: RawItem) -> str:
    if status != "failed":
        return f"oracle_{status}"
    if _ANY_ANSWER.search(item.description + "\n" + "\n".join(item.examples)):
        return "multiple_valid_answers"  # the statement's answer is one of several correct ones
    return "oracle_fails_examples"


def _slice_result(result: ExecResult, start: int, stop: int) -> ExecResult:
    from codeq.sandbox import ExecResult

    calls = list(result.calls[start:stop]) + [None] * max(
        0, stop - start - len(result.calls[start:stop])
    )
    status = result.status
    if status != "ok" and all(call is not None for call in calls):
        status = "ok"  # the run failed later, after these calls finished
    return ExecResult(status, result.backend, calls, result.stdout, result.stderr, result.seconds)


def validate(
    groups: list[Group], sandbox: Sandbox, drops: Counter[str], progress: bool
) -> list[Task]:
    """Oracle must pass every final test; each buggy program must fail at least one."""
    oracle_items = [(group.oracle, group.visible + group.hidden) for group in groups]
    buggy_items = [
        (draft.item.buggy_code, group.visible + group.hidden)
        for group in groups
        for draft in group.drafts
    ]
    timeouts = [group.call_timeout_s for group in groups] + [
        group.call_timeout_s for group in groups for _ in group.drafts
    ]
    requests = [
        build_request(program, tests, timeout)
        for (program, tests), timeout in zip(oracle_items + buggy_items, timeouts, strict=True)
    ]
    results = _chunked_batch(sandbox, requests, "validate", progress)
    verdicts = [
        verdict_from_result(result, tests)
        for result, (_, tests) in zip(results, oracle_items + buggy_items, strict=True)
    ]
    oracle_verdicts, buggy_verdicts = verdicts[: len(groups)], iter(verdicts[len(groups) :])
    tasks: list[Task] = []
    for group, oracle_verdict in zip(groups, oracle_verdicts, strict=True):
        for draft in group.drafts:
            buggy_verdict = next(buggy_verdicts)
            if not oracle_verdict.passed:
                drops["oracle_unstable"] += 1
            elif buggy_verdict.passed:
                drops["buggy_passes_all_tests"] += 1
            else:
                tasks.append(_task(draft, group))
    return tasks


def _task(draft: Draft, group: Group) -> Task:
    item = draft.item
    return Task(
        task_id=draft.task_id,
        slug=item.slug,
        level=item.level,  # type: ignore[arg-type]
        category=item.category,  # type: ignore[arg-type]
        subtype=item.subtype,
        description=item.description,
        examples=list(item.examples),
        constraints=item.constraints,
        buggy_code=item.buggy_code,
        oracle_code=item.oracle_code,
        bug_explanation=item.bug_explanation,
        entry={
            **draft.entry,
            "unordered": bool(group.visible[0].check.get("unordered")),
            "call_timeout_s": group.call_timeout_s,
        },
        visible_tests=list(draft.visible),
        hidden_tests=list(group.hidden),
    )


SPLITS = ("train", "validation", "test")


def split_by_slug(
    tasks: Sequence[Task], seed: int, test_fraction: float, validation_fraction: float = 0.0
) -> tuple[list[Task], list[Task], list[Task]]:
    """(train, validation, test): whole problems go to one side. Each held-out side gets at
    least one slug when its fraction is above 0 and the others keep one for training."""
    slugs = sorted({task.slug for task in tasks})
    random.Random(seed).shuffle(slugs)
    n_test = _held_out_count(test_fraction, len(slugs), reserve=1)
    n_validation = _held_out_count(validation_fraction, len(slugs) - n_test, reserve=1)
    test_slugs = set(slugs[:n_test])
    validation_slugs = set(slugs[n_test : n_test + n_validation])
    train = [task for task in tasks if task.slug not in test_slugs | validation_slugs]
    validation = [task for task in tasks if task.slug in validation_slugs]
    test = [task for task in tasks if task.slug in test_slugs]
    for split in (train, validation, test):  # so the first N of a split are a random sample
        random.Random(seed).shuffle(split)
    return train, validation, test


def round_sample(tasks: Sequence[Task], size: int, seed: int, round_number: int) -> list[Task]:
    """Round r's `size` training tasks: consecutive slices of one seeded shuffle, so rounds
    search different tasks until the split is used up (then it wraps around)."""
    if size >= len(tasks):
        return list(tasks)
    order = list(tasks)
    random.Random(seed).shuffle(order)
    start = (round_number * size) % len(order)
    return [order[(start + i) % len(order)] for i in range(size)]


def _held_out_count(fraction: float, available: int, reserve: int) -> int:
    """round(fraction * available), at least 1 when fraction > 0, leaving `reserve` slugs."""
    if fraction <= 0 or available <= reserve:
        return 0
    return min(max(1, round(fraction * available)), available - reserve)


def _counts(tasks: Sequence[Task], attribute: str) -> dict[str, int]:
    return dict(sorted(Counter(getattr(task, attribute) for task in tasks).items()))


def _timed(label: str, timings: dict[str, float], function: Callable[[], T]) -> T:
    start = time.perf_counter()
    value = function()
    timings[label] = round(time.perf_counter() - start, 2)
    return value


def prepare(
    source: str,
    out_dir: Path,
    config: CodeQConfig,
    sandbox: Sandbox | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Build train.jsonl, test.jsonl and report.json in out_dir; returns the report."""
    from codeq.sandbox import Sandbox

    started = time.perf_counter()
    timings: dict[str, float] = {}
    items = load_source(source)
    n_read = len(items)
    if config.tasks.max_items is not None:
        items = items[: config.tasks.max_items]
    unique, duplicates = deduplicate(items)
    drops: Counter[str] = Counter()
    groups = _timed("parse", timings, lambda: build_groups(unique, drops))
    _timed("synthesize", timings, lambda: synthesize_all(groups, config))
    if sandbox is None:
        with Sandbox(config.sandbox) as owned:
            tasks, backend = _execute(groups, owned, config, drops, progress, timings)
    else:
        tasks, backend = _execute(groups, sandbox, config, drops, progress, timings)
    if not tasks:
        raise DatasetError(
            f"no usable tasks in {source} ({dict(drops)})",
            hint="check that the source holds DebugBench Python 3 items with parseable examples",
        )
    splits = dict(
        zip(
            SPLITS,
            split_by_slug(
                tasks,
                config.tasks.seed,
                config.tasks.test_fraction,
                config.tasks.validation_fraction,
            ),
            strict=True,
        )
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, split_tasks in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", split_tasks)
    report = {
        "source": source,
        "backend": backend,
        "seed": config.tasks.seed,
        "test_fraction": config.tasks.test_fraction,
        "validation_fraction": config.tasks.validation_fraction,
        "items_read": n_read,
        "items_considered": len(items),
        "duplicates": duplicates,
        "unique": len(unique),
        "usable": len(tasks),
        "usable_fraction": round(len(tasks) / len(unique), 4) if unique else 0.0,
        "dropped": sum(drops.values()),
        "dropped_by_reason": dict(sorted(drops.items())),
        "by_level": _counts(tasks, "level"),
        "by_category": _counts(tasks, "category"),
        "hidden_tests_per_task": config.tasks.hidden_tests_per_task,
        **{
            name: {"tasks": len(split_tasks), "slugs": sorted({t.slug for t in split_tasks})}
            for name, split_tasks in splits.items()
        },
        "seconds": round(time.perf_counter() - started, 2),
        "timings": timings,
    }
    write_json(out_dir / "report.json", report)
    return report


def _execute(
    groups: list[Group],
    sandbox: Sandbox,
    config: CodeQConfig,
    drops: Counter[str],
    progress: bool,
    timings: dict[str, float],
) -> tuple[list[Task], str]:
    answered = _timed(
        "oracle", timings, lambda: run_oracles(groups, sandbox, config, drops, progress)
    )
    tasks = _timed("validate", timings, lambda: validate(answered, sandbox, drops, progress))
    return tasks, sandbox.backend


__all__ = ["SPLITS", "draft_tests", "prepare", "round_sample", "split_by_slug"]
