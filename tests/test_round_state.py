"""Which round runs next, the refusal to start a round before its predecessor finished, and
whether a chain of rounds goes on: through the library and through `python -m jobs.round`
against a real local store."""

from __future__ import annotations

import pytest
from test_jobs import error_lines, run_job

from codeq.config import StoreConfig
from codeq.errors import ConfigError, RoundOrderError
from codeq.pipeline.round_state import (
    ChainStep,
    after_round,
    check_rounds_requested,
    finished_rounds,
    last_finished_round,
    next_round,
    require_previous_finished,
    rounds_without_promotion,
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


# ------------------------------------------------------------------ chains of rounds


def promote(store, round_number: int, promoted: bool, run: str = RUN) -> None:
    """Round `round_number` ran to its end; its promote stage decided `promoted`."""
    layout = RoundLayout(run, round_number)
    store.mark_complete(layout.stage("promote"), {"stage": "promote", "promote": promoted})
    finish(store, round_number, run)


def chain(store, finished: int, first: int = 0, rounds: int = 10, patience: int = 1):
    return after_round(store, RUN, finished, first=first, rounds=rounds, patience=patience)


def test_a_chain_stops_once_the_rounds_asked_for_have_run(store):
    promote(store, 0, True)
    assert chain(store, 0, rounds=2) == ChainStep(1, "1 of 2 round(s) finished; next: round 1")
    promote(store, 1, True)
    step = chain(store, 1, rounds=2)
    assert step.next_round is None
    assert step.reason == "2 of 2 round(s) asked for have finished"
    # One round asked for (argo/round.yaml): never a second, whatever it promoted.
    assert chain(store, 1, first=1, rounds=1).next_round is None


def test_a_chain_counts_its_rounds_from_its_first(store):
    for number in range(4):
        promote(store, number, True)
    assert chain(store, 3, first=2, rounds=3).next_round == 4
    assert chain(store, 3, first=1, rounds=3).next_round is None


def test_a_chain_stops_after_patience_rounds_in_a_row_without_a_promotion(store):
    promote(store, 0, False)
    assert chain(store, 0, patience=2).next_round == 1
    assert chain(store, 0, patience=1).next_round is None
    promote(store, 1, False)
    step = chain(store, 1, patience=2)
    assert step.next_round is None
    assert step.reason == (
        "the last 2 finished round(s) in a row promoted nothing (promotion.patience = 2); "
        "2 of 10 round(s) ran"
    )


def test_a_promotion_resets_the_count(store):
    promote(store, 0, False)
    promote(store, 1, True)
    promote(store, 2, False)
    assert rounds_without_promotion(store, RUN) == 1
    assert rounds_without_promotion(store, RUN, through=1) == 0
    assert chain(store, 2, patience=2).next_round == 3
    promote(store, 3, False)
    assert chain(store, 3, patience=2).next_round is None


def test_rounds_of_an_earlier_submission_count_toward_patience(store):
    promote(store, 0, False)  # the previous submission's last round
    assert chain(store, 0, patience=2).next_round == 1
    promote(store, 1, False)  # this submission's first round
    assert chain(store, 1, first=1, rounds=5, patience=2).next_round is None


def test_a_failed_round_is_resumed_not_skipped(store):
    promote(store, 0, True)
    # Round 1 failed in train: its earlier stages are complete, its report is not.
    store.mark_complete(RoundLayout(RUN, 1).stage("tasks"), {})
    store.mark_complete(RoundLayout(RUN, 1).stage("pairs"), {})
    with pytest.raises(RoundOrderError, match="round 1 of run 'jobs' has not finished"):
        chain(store, 1)
    # The resubmission (round "next") resolves to the unfinished round 1, which is its first.
    assert next_round(store, RUN) == 1
    promote(store, 1, True)
    assert chain(store, 1, first=1, rounds=2) == ChainStep(
        2, "1 of 2 round(s) finished; next: round 2"
    )


def test_a_chain_asks_for_one_to_max_rounds(store):
    check_rounds_requested(1, 10)
    check_rounds_requested(10, 10)
    check_rounds_requested(500)
    with pytest.raises(ConfigError, match="rounds=11 is more than the 10 round"):
        check_rounds_requested(11, 10)
    with pytest.raises(ConfigError, match="at least one round"):
        check_rounds_requested(0, 10)


def test_round_job_continue_prints_the_next_round_or_stop(tmp_path, store):
    promote(store, 0, False)
    env = {"CODEQ_STORE__URI": f"file://{tmp_path / 'store'}", "CODEQ_STORE__ROUND": "0"}
    args = ("--continue", "--first", "0", "--rounds", "3")
    patient = run_job("round", {**env, "CODEQ_PROMOTION__PATIENCE": "2"}, args=args)
    assert patient.returncode == 0, patient.stderr
    assert patient.stdout == "1\n"
    assert "1 of 3 round(s) finished; next: round 1; going on" in patient.stderr
    stopped = run_job("round", env, args=args)  # promotion.patience 1, the default
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == "stop\n"
    assert "promoted nothing (promotion.patience = 1)" in stopped.stderr
    unfinished = run_job("round", {**env, "CODEQ_STORE__ROUND": "1"}, args=args)
    assert unfinished.returncode == 2 and unfinished.stdout == ""
    assert error_lines(unfinished)[0].startswith(
        "error: round 1 of run 'jobs' has not finished (no "
    )


def test_round_job_refuses_more_rounds_than_the_deadline_covers(tmp_path):
    env = {"CODEQ_STORE__URI": f"file://{tmp_path / 'store'}", "CODEQ_STORE__ROUND": "next"}
    fine = run_job("round", env, args=("--rounds", "3", "--max-rounds", "3"))
    assert fine.returncode == 0 and fine.stdout == "0\n", fine.stderr
    refused = run_job("round", env, args=("--rounds", "4", "--max-rounds", "3"))
    assert refused.returncode == 2 and refused.stdout == ""
    assert error_lines(refused) == [
        "error: rounds=4 is more than the 3 round(s) the workflow's deadline was derived "
        "from (workflow.maxRounds)"
    ]
