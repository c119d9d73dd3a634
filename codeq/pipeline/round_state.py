"""Which rounds of a run have finished, and which round may start next.

A round is finished when its report stage is complete (the report is the last stage, so every
other stage of the round is complete too). Rounds chain: round N starts from the policy promoted
by rounds < N, so round N may start only once round N - 1 has finished.
"""

from __future__ import annotations

import re

from codeq.errors import RoundOrderError
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
