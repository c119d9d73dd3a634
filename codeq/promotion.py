"""Promotion: does the round's candidate policy replace the incumbent?

Decided on the validation split only (the test split is reported, never used to decide), from
the same tasks evaluated for both policies: a paired, one-sided exact McNemar test. The candidate
is promoted when, in the first of `promotion.modes`, it solves significantly more validation
tasks than the incumbent (at `promotion.level`), and in no mode it solves significantly fewer.
Two equal policies are therefore promoted in at most `level` of rounds, not half of them.
"""

from __future__ import annotations

from math import comb

from pydantic import BaseModel, ConfigDict, Field

from codeq.config import PromotionConfig
from codeq.errors import CorruptInputError
from codeq.evaluate.results import EvalResults, ModeResult
from codeq.schemas import Lineage


def one_sided_mcnemar(gained: int, lost: int) -> float:
    """P(at least `gained` of the gained + lost discordant tasks favour the candidate) when
    neither policy is better (each discordant task a fair coin): the exact McNemar p-value."""
    discordant = gained + lost
    if discordant == 0:
        return 1.0
    return sum(comb(discordant, k) for k in range(gained, discordant + 1)) / 2**discordant


class ModeComparison(BaseModel):
    """The candidate and the incumbent in one mode on the same validation tasks."""

    model_config = ConfigDict(extra="forbid")

    mode: str
    tasks: int
    candidate_solved: int
    incumbent_solved: int
    gained: list[str] = Field(description="Tasks the candidate solves and the incumbent not.")
    lost: list[str] = Field(description="Tasks the incumbent solves and the candidate not.")
    p_better: float = Field(description="One-sided exact McNemar p: candidate better.")
    p_worse: float = Field(description="One-sided exact McNemar p: candidate worse.")


class PromotionDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    round: int
    promote: bool
    reason: str
    split: str = "validation"
    level: float
    gate_mode: str | None = None
    comparisons: list[ModeComparison] = Field(default_factory=list)
    candidate: Lineage | None = None
    incumbent: Lineage | None = None


def compare(mode: str, candidate: EvalResults, incumbent: EvalResults) -> ModeComparison:
    if mode not in candidate.modes or mode not in incumbent.modes:
        raise CorruptInputError(
            f"the validation evaluations lack the {mode!r} mode",
            hint="rerun the evaluate stage with the promotion.modes of this config",
        )
    return compare_modes(mode, candidate.modes[mode], incumbent.modes[mode])


def compare_modes(label: str, candidate: ModeResult, incumbent: ModeResult) -> ModeComparison:
    """Two mode results paired on the same tasks (two policies, or two modes of one)."""
    new, old = candidate.per_task, incumbent.per_task
    if set(new) != set(old):
        raise CorruptInputError(
            "the candidate and the incumbent were evaluated on different validation tasks",
            hint="rerun the evaluate stage so both use the same tasks",
        )
    gained = sorted(task for task in new if new[task] and not old[task])
    lost = sorted(task for task in new if old[task] and not new[task])
    return ModeComparison(
        mode=label,
        tasks=len(new),
        candidate_solved=sum(new.values()),
        incumbent_solved=sum(old.values()),
        gained=gained,
        lost=lost,
        p_better=one_sided_mcnemar(len(gained), len(lost)),
        p_worse=one_sided_mcnemar(len(lost), len(gained)),
    )


def decide(
    round_number: int,
    candidate: EvalResults | None,
    incumbent: EvalResults | None,
    config: PromotionConfig,
) -> PromotionDecision:
    """The promotion decision from validation results only (ValueError for any other split)."""
    base = {"round": round_number, "level": config.level}
    if candidate is None:
        return PromotionDecision(
            **base, promote=False, reason="no adapter was trained this round (no preference pairs)"
        )
    if incumbent is None:
        return PromotionDecision(
            **base,
            promote=False,
            reason="no validation tasks: nothing to decide on (tasks.validation_fraction is 0)",
            candidate=candidate.policy,
        )
    for results in (candidate, incumbent):
        if results.split != "validation":
            raise ValueError(f"promotion decides on the validation split, not {results.split}")
    comparisons = [compare(mode, candidate, incumbent) for mode in config.modes]
    gate = comparisons[0]
    regressions = [c for c in comparisons if c.p_worse < config.level]
    significant = gate.p_better < config.level
    promote = significant and not regressions
    return PromotionDecision(
        **base,
        promote=promote,
        reason=_reason(gate, significant, regressions, config.level),
        gate_mode=gate.mode,
        comparisons=comparisons,
        candidate=candidate.policy,
        incumbent=incumbent.policy,
    )


def _reason(
    gate: ModeComparison, significant: bool, regressions: list[ModeComparison], level: float
) -> str:
    verdict = "PROMOTED" if significant and not regressions else "kept the incumbent"
    text = (
        f"{verdict}: on {gate.tasks} validation tasks ({gate.mode}) the candidate solves "
        f"{gate.candidate_solved} vs {gate.incumbent_solved}, {len(gate.gained)} gained and "
        f"{len(gate.lost)} lost; one-sided exact McNemar p = {gate.p_better:.3g} "
        f"{'<' if significant else '>='} {level}"
    )
    if regressions:
        worse = ", ".join(f"{c.mode} (p = {c.p_worse:.3g})" for c in regressions)
        text += f"; significantly worse in {worse}"
    return text
