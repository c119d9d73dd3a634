"""Which round runs next, and the refusal to start a round before its predecessor finished:
through the library and through `python -m jobs.round` against a real local store."""

from __future__ import annotations

import pytest
from test_jobs import error_lines, run_job

from codeq.config import StoreConfig
from codeq.errors import RoundOrderError
from codeq.pipeline.round_state import (
    finished_rounds,
    last_finished_round,
    next_round,
    require_previous_finished,
)
from codeq.store import RoundLayout, open_store

RUN = "jobs"  # the run name run_job uses


@pytest.fixture
def store(tmp_path):
    return open_store(StoreConfig(uri=f"file://{tmp_path / 'store'}"))


def finish(store, round_number: int, run: str = RUN) -> None:
    store.mark_complete(RoundLayout(run, round_number).stage("report"), {"stage": "report"})


def test_a_new_run_starts_at_round_zero(store):
    assert last_finished_round(store, RUN) is None
    assert next_round(store, RUN) == 0
    require_previous_finished(store, RoundLayout(RUN, 0))


def test_the_next_round_follows_the_last_finished_one(store):
    finish(store, 0)
    finish(store, 1)
    finish(store, 0, run="other")
    store.mark_complete(RoundLayout(RUN, 2).stage("tasks"), {})  # round 2 started, not finished
    assert finished_rounds(store, RUN) == [0, 1]
    assert next_round(store, RUN) == 2
    require_previous_finished(store, RoundLayout(RUN, 2))


def test_a_gap_in_the_chain_is_the_next_round(store):
    finish(store, 0)
    finish(store, 2)  # round 1 never finished: the chain stops there
    assert last_finished_round(store, RUN) == 0
    assert next_round(store, RUN) == 1


def test_a_round_with_an_unfinished_predecessor_is_refused(store):
    finish(store, 0)
    with pytest.raises(RoundOrderError, match="round 2 of run 'jobs' cannot start: round 1"):
        require_previous_finished(store, RoundLayout(RUN, 2))


def test_round_job_prints_the_next_round(tmp_path, store):
    finish(store, 0)
    uri = {"CODEQ_STORE__URI": f"file://{tmp_path / 'store'}"}
    result = run_job("round", {**uri, "CODEQ_STORE__ROUND": "next"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def test_round_job_refuses_a_round_that_skips_ahead(tmp_path, store):
    finish(store, 0)
    uri = {"CODEQ_STORE__URI": f"file://{tmp_path / 'store'}"}
    assert run_job("round", {**uri, "CODEQ_STORE__ROUND": "1"}).stdout.strip() == "1"
    refused = run_job("round", {**uri, "CODEQ_STORE__ROUND": "3"})
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert error_lines(refused) == [
        "error: round 3 of run 'jobs' cannot start: round 2 has not finished (no "
        f"file://{tmp_path / 'store'}/runs/jobs/round-2/report marker)"
    ]


def test_codeq_round_refuses_a_round_whose_predecessor_has_not_finished(tmp_path, capsys):
    from codeq.cli import run as cli_run

    code = cli_run(["round", "--round", "1", "--out", str(tmp_path / "local")])
    captured = capsys.readouterr()
    assert code == 2
    assert [line for line in captured.err.splitlines() if line.startswith("error:")] == [
        "error: round 1 of run 'local' cannot start: round 0 has not finished (no "
        f"file://{tmp_path / 'local' / 'store'}/runs/local/round-0/report marker)"
    ]


def test_the_prepare_job_refuses_a_round_whose_predecessor_has_not_finished(tmp_path):
    uri = {"CODEQ_STORE__URI": f"file://{tmp_path / 'store'}"}
    refused = run_job("prepare", {**uri, "CODEQ_STORE__ROUND": "1"})
    assert refused.returncode == 2
    assert error_lines(refused)[0].startswith("error: round 1 of run 'jobs' cannot start")
