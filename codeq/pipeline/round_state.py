"""Which rounds of a run have finished, and which round may start next.

A round is finished when its report stage is complete (the report is the last stage, so every
other stage of the round is complete too). Rounds chain: round N starts from the policy promoted
by rounds < N, so round N may start only once round N - 1 has finished.

A chain of rounds (`codeq rounds`, the multi-round workflow) goes on while rounds promote: it
stops after `promotion.patience` finished rounds in a row that promoted nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from codeq.errors import ConfigError, RoundOrderError
from codeq.store import MARKER_NAME, ArtifactStore, RoundLayout

FINAL_STAGE = "report"
_ROUND_MARKER = re.compile(rf"^runs/[^/]+/round-(\d+)/{FINAL_STAGE}/{MARKER_NAME}$")


def round_finished(store: ArtifactStore, layout: RoundLayout) -> bool:
    return store.is_complete(layout.stage(FINAL_STAGE))


def finished_rounds(store: ArtifactStore, run: str) -> list[int]:
    """Round numbers of `run` whose final stage is complete, ascending."""
    prefix = RoundLayout(run, 0).run_prefix
    rounds = []
    for key in store.list(prefix):
        match = _ROUND_MARKER.match(key)
        if match:
            rounds.append(int(match.group(1)))
    return sorted(rounds)


def last_finished_round(store: ArtifactStore, run: str) -> int | None:
    """The highest round n such that rounds 0..n have all finished; None before round 0 has."""
    finished = set(finished_rounds(store, run))
    last = None
    while (0 if last is None else last + 1) in finished:
        last = 0 if last is None else last + 1
    return last


def next_round(store: ArtifactStore, run: str) -> int:
    """The round to run next: the first one that has not finished."""
    last = last_finished_round(store, run)
    return 0 if last is None else last + 1


def require_previous_finished(store: ArtifactStore, layout: RoundLayout) -> None:
    """Refuse to start round N while round N - 1 of the same run has not finished."""
    if layout.round == 0:
        return
    previous = layout.of_round(layout.round - 1)
    if not round_finished(store, previous):
        upcoming = next_round(store, layout.run)
        raise RoundOrderError(
            f"round {layout.round} of run {layout.run!r} cannot start: round "
            f"{previous.round} has not finished (no {store.describe(previous.stage(FINAL_STAGE))} "
            "marker)",
            hint=f"run round {upcoming} first (the next unfinished round of this run)",
        )


def round_promoted(store: ArtifactStore, layout: RoundLayout) -> bool:
    """Whether the round's promote stage promoted its candidate (False before it decided)."""
    return bool(store.marker(layout.stage("promote")).get("promote"))


def rounds_without_promotion(store: ArtifactStore, run: str, through: int | None = None) -> int:
    """How many finished rounds in a row, ending at round `through` (default: the last finished
    round of the run), promoted nothing. A promotion, or a round that has not finished, ends
    the count."""
    number = last_finished_round(store, run) if through is None else through
    streak = 0
    while number is not None and number >= 0:
        layout = RoundLayout(run, number)
        if not round_finished(store, layout) or round_promoted(store, layout):
            break
        streak += 1
        number -= 1
    return streak


@dataclass(frozen=True)
class ChainStep:
    """What a chain of rounds does after one of them finished: run `next_round`, or stop
    (`next_round` None); `reason` says why, in a line for the log."""

    next_round: int | None
    reason: str


def check_rounds_requested(rounds: int, max_rounds: int | None = None) -> None:
    """Refuse a chain longer than `max_rounds` (what the workflow's deadline was derived from)
    or shorter than one round."""
    if rounds < 1:
        raise ConfigError(
            f"rounds={rounds}: a submission runs at least one round",
            hint="ask for 1 or more rounds (-p rounds=N)",
        )
    if max_rounds is not None and rounds > max_rounds:
        raise ConfigError(
            f"rounds={rounds} is more than the {max_rounds} round(s) the workflow's deadline "
            "was derived from (workflow.maxRounds)",
            hint=f"ask for at most {max_rounds} rounds, or raise workflow.maxRounds with "
            "`helm upgrade` (the workflow's deadline grows with it)",
        )


def after_round(
    store: ArtifactStore, run: str, finished: int, *, first: int, rounds: int, patience: int
) -> ChainStep:
    """After round `finished` of a chain that started at round `first` and asked for `rounds`
    rounds: go on with the next round, or stop because `rounds` rounds have run or because the
    last `patience` finished rounds of the run (this chain's or earlier ones) promoted nothing.

    Raises RoundOrderError when round `finished` has not finished: the chain never skips a
    round; resubmitting resumes it (`next_round`)."""
    if finished < first:
        raise ConfigError(f"round {finished} comes before the chain's first round {first}")
    layout = RoundLayout(run, finished)
    if not round_finished(store, layout):
        raise RoundOrderError(
            f"round {finished} of run {run!r} has not finished (no "
            f"{store.describe(layout.stage(FINAL_STAGE))} marker), so no later round starts",
            hint=f"resubmit: round {finished} then resumes from its last completed stage",
        )
    done = finished - first + 1
    if done >= rounds:
        return ChainStep(None, f"{done} of {rounds} round(s) asked for have finished")
    streak = rounds_without_promotion(store, run, through=finished)
    if streak >= patience:
        return ChainStep(
            None,
            f"the last {streak} finished round(s) in a row promoted nothing "
            f"(promotion.patience = {patience}); {done} of {rounds} round(s) ran",
        )
    return ChainStep(
        finished + 1, f"{done} of {rounds} round(s) finished; next: round {finished + 1}"
    )
