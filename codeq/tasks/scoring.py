"""Turn sandbox results into verdicts: the single place a program passes or fails a test.

Expected outputs stay here, outside the sandbox; the runner only returns what the program did.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from codeq.schemas import Task, TestCase, TestOutcome, TestSplit, Verdict
from codeq.tasks.harness import PRELUDE, RUNNER_SOURCE

if TYPE_CHECKING:
    from codeq.sandbox import ExecRequest, ExecResult, Sandbox

DEFAULT_FLOAT_TOLERANCE = 1e-5
# Sandbox statuses that end a run before results; a Verdict names them in its own words.
_RUN_STATUS_TO_VERDICT = {
    "syntax_error": "syntax_error",
    "load_error": "crash",
    "timeout": "timeout",
    "memory": "memory",
    "killed": "crash",
    "output_limit": "output_limit",
    "sandbox_error": "sandbox_error",
}


def _numbers_close(actual: Any, expected: Any, tolerance: float) -> bool:
    return math.isclose(float(actual), float(expected), rel_tol=tolerance, abs_tol=tolerance)


def values_equal(actual: Any, expected: Any, tolerance: float) -> bool:
    """Deep equality where numbers compare with a tolerance once either side is a float."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return actual is expected or (
            isinstance(actual, bool) and isinstance(expected, bool) and actual == expected
        )
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        if isinstance(actual, float) or isinstance(expected, float):
            return _numbers_close(actual, expected, tolerance)
        return actual == expected
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            values_equal(a, e, tolerance) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            values_equal(actual[key], expected[key], tolerance) for key in actual
        )
    return bool(actual == expected)


def _sort_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _canonical_unordered(value: Any, deep: bool) -> Any:
    if not isinstance(value, list):
        return value
    items = [_canonical_unordered(item, deep) if deep else item for item in value]
    return sorted(items, key=_sort_key)


def _k_prefix_match(actual: Any, expected: Any, check: dict[str, Any], tolerance: float) -> bool:
    """[k, nums] against [k, first k expected]: only nums[:k] is judged, as on LeetCode."""
    if not (isinstance(actual, list) and len(actual) == 2 and isinstance(actual[1], list)):
        return False
    k, prefix = expected
    if not values_equal(actual[0], k, tolerance) or not isinstance(k, int):
        return False
    got = actual[1][:k]
    if check.get("unordered"):
        got, prefix = sorted(got, key=_sort_key), sorted(prefix, key=_sort_key)
    return values_equal(got, prefix, tolerance)


def outputs_match(actual: Any, expected: Any, check: dict[str, Any]) -> bool:
    """Compare one result with its expected output under the test's check options."""
    tolerance = float(check.get("float_tolerance", DEFAULT_FLOAT_TOLERANCE))
    if values_equal(actual, expected, tolerance):
        return True
    if actual is None and expected == []:
        return True  # LeetCode's judge prints a None list result as []
    if check.get("k_prefix"):
        return _k_prefix_match(actual, expected, check, tolerance)
    if check.get("unordered") and isinstance(actual, list) and isinstance(expected, list):
        for deep in (False, True):
            if values_equal(
                _canonical_unordered(actual, deep), _canonical_unordered(expected, deep), tolerance
            ):
                return True
    return False


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_request(
    program: str, tests: Sequence[TestCase], call_timeout_s: float | None = None
) -> ExecRequest:
    """One sandbox request: the program with every test as one call, expected outputs left out."""
    from codeq.sandbox import ExecRequest

    return ExecRequest(
        program=program,
        runner=RUNNER_SOURCE,
        calls=[test.call for test in tests],
        prelude=PRELUDE,
        call_timeout_s=call_timeout_s,
    )


def _outcome(call_result: Any, test: TestCase) -> TestOutcome:
    if call_result is None:
        return TestOutcome(passed=False, status="not_run")
    if not call_result.ok:
        error = call_result.error or "error"
        status = "timeout" if error.lower().startswith("timeout") else "error"
        return TestOutcome(passed=False, status=status, detail=error[:200])
    if outputs_match(call_result.value, test.expected, test.check):
        return TestOutcome(passed=True, status="ok")
    return TestOutcome(
        passed=False,
        status="wrong_answer",
        detail=f"got {_short(call_result.value)}",
    )


def verdict_from_result(result: ExecResult, tests: Sequence[TestCase]) -> Verdict:
    """Decide one program's verdict from its sandbox run (results compared here, outside)."""
    outcomes = [
        _outcome(result.calls[index] if index < len(result.calls) else None, test)
        for index, test in enumerate(tests)
    ]
    n_passed = sum(outcome.passed for outcome in outcomes)
    if result.status != "ok":
        status = _RUN_STATUS_TO_VERDICT.get(result.status, "crash")
        detail = (result.stderr or "").strip().splitlines()
        if status in {"syntax_error", "crash", "sandbox_error"} and detail:
            outcomes = [
                o
                if o.status != "not_run"
                else TestOutcome(passed=False, status="not_run", detail=detail[-1][:200])
                for o in outcomes
            ]
    elif n_passed == len(tests):
        status = "passed"
    elif any(o.status == "timeout" for o in outcomes):
        status = "timeout"
    else:
        status = "failed"
    return Verdict(
        passed=status == "passed",
        n_passed=n_passed,
        n_total=len(tests),
        status=status,
        backend=result.backend,
        tests=outcomes,
        seconds=round(result.seconds, 4),
    )


def score_programs(
    items: Sequence[tuple[Task, str]], which: TestSplit, sandbox: Sandbox
) -> list[Verdict]:
    """Score each (task, program) on the task's visible, hidden or all tests; order preserved."""
    requests = [
        build_request(program, task.tests(which), task.entry.get("call_timeout_s"))
        for task, program in items
    ]
    results = sandbox.run_batch(requests) if requests else []
    return [
        verdict_from_result(result, task.tests(which))
        for result, (task, _) in zip(results, items, strict=True)
    ]
