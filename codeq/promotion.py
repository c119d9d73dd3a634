"""Promotion: does the round's candidate policy replace the incumbent?

Decided on the validation split only (the test split is reported, never used to decide), from
the same tasks evaluated for both policies, by paired one-sided exact tests. The candidate is
promoted when, in the first of `promotion.modes`, it does significantly better on the validation
tasks than the incumbent (at `promotion.level`), and in no mode of `promotion.modes` or
`promotion.guard_modes` it does significantly worse (nor, with `promotion.reach_guard`, reaches
significantly fewer tasks with any of its answers). Two equal policies are therefore promoted
in at most `level` of rounds, not half of them.

The test of the first mode: with one greedy answer per task, the exact McNemar test on the tasks
solved; with `promotion.samples` = k, the exact sign-flip test on each task's pass count of its
greedy answer plus k sampled ones, which sees a gain of a few points more often (simulated in
bench/promotion_power.py, docs/promotion-power.md). Every other mode: McNemar on greedy answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb
from typing import Any

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


def sign_flip_p_values(differences: Sequence[int]) -> tuple[float, float]:
    """One-sided exact p-values (candidate better, candidate worse) of the paired sign-flip
    test on per-task differences in pass counts (the candidate's passes minus the incumbent's).

    When neither policy is better, each task's difference is as likely positive as negative,
    so the sum of the positive differences is distributed as the sum over the m nonzero tasks
    of |d| taken with probability 1/2 each: its 2**m sign assignments are counted exactly (by
    convolution: integers, no sampling). With one greedy answer per task (differences in -1,
    0, 1) it is the exact McNemar test."""
    sizes = [abs(d) for d in differences if d]
    counts = [1]  # counts[s]: sign assignments whose positive differences sum to s
    for size in sizes:
        grown = counts + [0] * size
        for total, ways in enumerate(counts):
            grown[total + size] += ways
        counts = grown
    positive = sum(d for d in differences if d > 0)
    assignments = 2 ** len(sizes)
    return sum(counts[positive:]) / assignments, sum(counts[: positive + 1]) / assignments


class Reach(BaseModel):
    """Tasks where at least one of a policy's answers (greedy plus k sampled) passes: what a
    search answering from many samples can find, which the pass-count test does not see."""

    model_config = ConfigDict(extra="forbid")

    candidate: int = Field(description="Tasks some answer of the candidate passes.")
    incumbent: int = Field(description="Tasks some answer of the incumbent passes.")
    gained: int = Field(description="Tasks only the candidate reaches.")
    lost: int = Field(description="Tasks only the incumbent reaches.")
    p_worse: float = Field(description="One-sided exact McNemar p: the candidate reaches fewer.")


class PassCounts(BaseModel):
    """Each task's passing answers, its greedy one plus k sampled, for both policies."""

    model_config = ConfigDict(extra="forbid")

    samples: int = Field(description="k sampled answers per task beside the greedy one.")
    answers: int = Field(description="Answers per policy: tasks x (k + 1).")
    candidate_passes: int
    incumbent_passes: int
    tasks_better: int = Field(description="Tasks where the candidate passes more answers.")
    tasks_worse: int = Field(description="Tasks where the incumbent passes more answers.")
    reach: Reach | None = Field(
        None, description="Tasks some answer passes (None in decisions written before it)."
    )


class ModeComparison(BaseModel):
    """The candidate and the incumbent in one mode on the same validation tasks."""

    model_config = ConfigDict(extra="forbid")

    mode: str
    tasks: int
    candidate_solved: int
    incumbent_solved: int
    gained: list[str] = Field(description="Tasks the candidate solves and the incumbent not.")
    lost: list[str] = Field(description="Tasks the incumbent solves and the candidate not.")
    p_better: float = Field(description="One-sided exact p (see `test`): candidate better.")
    p_worse: float = Field(description="One-sided exact p (see `test`): candidate worse.")
    test: str = Field(
        "mcnemar", description="'mcnemar' (greedy answers) or 'sign_flip' (pass counts)."
    )
    pass_counts: PassCounts | None = Field(None, description="The sign-flip test's counts.")


class PromotionDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    round: int
    promote: bool
    reason: str
    split: str = "validation"
    level: float
    gate_mode: str | None = None
    guard_modes: list[str] = Field(
        default_factory=list, description="Modes checked only for no significant regression."
    )
    samples: int = Field(0, description="Sampled answers per task in the gate mode.")
    reach_guard: bool = Field(
        False, description="Whether reaching significantly fewer tasks blocks promotion."
    )
    forced: bool = Field(
        False, description="Promoted by promotion.force_rounds, not by the paired tests."
    )
    comparisons: list[ModeComparison] = Field(default_factory=list)
    candidate: Lineage | None = None
    incumbent: Lineage | None = None


def compare(
    mode: str, candidate: EvalResults, incumbent: EvalResults, samples: int = 0
) -> ModeComparison:
    """The two policies in `mode`; with `samples` = k, on pass counts of greedy + k samples."""
    if mode not in candidate.modes or mode not in incumbent.modes:
        raise CorruptInputError(
            f"the validation evaluations lack the {mode!r} mode",
            hint="rerun the evaluate stage with the promotion.modes and promotion.guard_modes "
            "of this config",
        )
    return compare_modes(mode, candidate.modes[mode], incumbent.modes[mode], samples)


def compare_modes(
    label: str, candidate: ModeResult, incumbent: ModeResult, samples: int = 0
) -> ModeComparison:
    """Two mode results paired on the same tasks (two policies, or two modes of one): the exact
    McNemar test on greedy answers, or with `samples` = k the exact sign-flip test on each
    task's passes among its greedy answer and k sampled ones."""
    new, old = candidate.per_task, incumbent.per_task
    if set(new) != set(old):
        raise CorruptInputError(
            "the candidate and the incumbent were evaluated on different validation tasks",
            hint="rerun the evaluate stage so both use the same tasks",
        )
    gained = sorted(task for task in new if new[task] and not old[task])
    lost = sorted(task for task in new if old[task] and not new[task])
    comparison = ModeComparison(
        mode=label,
        tasks=len(new),
        candidate_solved=sum(new.values()),
        incumbent_solved=sum(old.values()),
        gained=gained,
        lost=lost,
        p_better=one_sided_mcnemar(len(gained), len(lost)),
        p_worse=one_sided_mcnemar(len(lost), len(gained)),
    )
    if not samples:
        return comparison
    new_counts = pass_counts(label, candidate, samples, "candidate")
    old_counts = pass_counts(label, incumbent, samples, "incumbent")
    differences = [new_counts[task] - old_counts[task] for task in sorted(new)]
    p_better, p_worse = sign_flip_p_values(differences)
    reach_gained = sum(1 for task in new if new_counts[task] and not old_counts[task])
    reach_lost = sum(1 for task in new if old_counts[task] and not new_counts[task])
    return comparison.model_copy(
        update={
            "p_better": p_better,
            "p_worse": p_worse,
            "test": "sign_flip",
            "pass_counts": PassCounts(
                samples=samples,
                answers=len(new) * (samples + 1),
                candidate_passes=sum(new_counts.values()),
                incumbent_passes=sum(old_counts.values()),
                tasks_better=sum(d > 0 for d in differences),
                tasks_worse=sum(d < 0 for d in differences),
                reach=Reach(
                    candidate=sum(1 for passes in new_counts.values() if passes),
                    incumbent=sum(1 for passes in old_counts.values() if passes),
                    gained=reach_gained,
                    lost=reach_lost,
                    p_worse=one_sided_mcnemar(reach_lost, reach_gained),
                ),
            ),
        }
    )


def gate_figures(comparison: ModeComparison) -> dict[str, Any]:
    """What a learning-curve figure marks of a round's gate: the tasks it gained and lost and
    its p for a gain. Under the sign-flip test (promotion.samples) the tasks where the candidate
    passes more and fewer of its answers, with "answers" a task (greedy + sampled), so that
    the counts and the p shown are those of the test that decided."""
    counts = comparison.pass_counts
    if counts is None:
        return {
            "gained": len(comparison.gained),
            "lost": len(comparison.lost),
            "p_better": comparison.p_better,
        }
    return {
        "gained": counts.tasks_better,
        "lost": counts.tasks_worse,
        "p_better": comparison.p_better,
        "answers": counts.samples + 1,
    }


def pass_counts(mode: str, result: ModeResult, samples: int, role: str) -> dict[str, int]:
    """task -> passing answers among the greedy one and `samples` sampled ones."""
    sampled = result.sampled
    if (
        sampled is None
        or sampled.samples != samples
        or set(sampled.per_task) != set(result.per_task)
    ):
        held = "none" if sampled is None else f"{sampled.samples} per task"
        raise CorruptInputError(
            f"the {role}'s validation evaluation in {mode} holds no {samples} sampled answers "
            f"per task (it holds {held})",
            hint="rerun the evaluate stage with this config's promotion.samples",
        )
    return {task: int(solved) + sampled.per_task[task] for task, solved in result.per_task.items()}


def decide(
    round_number: int,
    candidate: EvalResults | None,
    incumbent: EvalResults | None,
    config: PromotionConfig,
) -> PromotionDecision:
    """The promotion decision from validation results only (ValueError for any other split);
    a round in `config.force_rounds` promotes its candidate whatever the tests say."""
    decision = _decide_by_tests(round_number, candidate, incumbent, config)
    if round_number not in config.force_rounds or decision.promote or candidate is None:
        return decision
    return decision.model_copy(
        update={
            "promote": True,
            "forced": True,
            "candidate": candidate.policy,
            "reason": f"PROMOTED by promotion.force_rounds (round {round_number}), whatever "
            f"the tests say; the tests alone: {decision.reason}",
        }
    )


def _decide_by_tests(
    round_number: int,
    candidate: EvalResults | None,
    incumbent: EvalResults | None,
    config: PromotionConfig,
) -> PromotionDecision:
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
    gate_mode = config.modes[0]
    guards = [mode for mode in config.guard_modes if mode not in config.modes]
    comparisons = [compare(gate_mode, candidate, incumbent, config.samples)] + [
        compare(mode, candidate, incumbent) for mode in [*config.modes[1:], *guards]
    ]
    gate = comparisons[0]
    regressions = [c for c in comparisons if c.p_worse < config.level]
    reach = gate.pass_counts.reach if gate.pass_counts else None
    narrower = bool(config.reach_guard and reach and reach.p_worse < config.level)
    significant = gate.p_better < config.level
    promote = significant and not regressions and not narrower
    return PromotionDecision(
        **base,
        promote=promote,
        reason=_reason(gate, significant, regressions, narrower, config.level),
        gate_mode=gate.mode,
        guard_modes=guards,
        samples=config.samples,
        reach_guard=config.reach_guard,
        comparisons=comparisons,
        candidate=candidate.policy,
        incumbent=incumbent.policy,
    )


def _reason(
    gate: ModeComparison,
    significant: bool,
    regressions: list[ModeComparison],
    narrower: bool,
    level: float,
) -> str:
    verdict = "PROMOTED" if significant and not (regressions or narrower) else "kept the incumbent"
    text = (
        f"{verdict}: on {gate.tasks} validation tasks ({gate.mode}) the candidate solves "
        f"{gate.candidate_solved} vs {gate.incumbent_solved}, {len(gate.gained)} gained and "
        f"{len(gate.lost)} lost; "
    )
    counts = gate.pass_counts
    if counts is None:
        text += "one-sided exact McNemar"
    else:
        text += (
            f"with {counts.samples} sampled answers per task beside the greedy one, it passes "
            f"{counts.candidate_passes} of {counts.answers} answers vs "
            f"{counts.incumbent_passes}, more on {counts.tasks_better} tasks and fewer on "
            f"{counts.tasks_worse}; one-sided exact sign-flip"
        )
    text += f" p = {gate.p_better:.3g} {'<' if significant else '>='} {level}"
    if regressions:
        worse = ", ".join(f"{c.mode} (p = {c.p_worse:.3g})" for c in regressions)
        text += f"; significantly worse in {worse}"
    reach = counts.reach if counts else None
    if reach is not None:
        text += (
            f"; some answer passes on {reach.candidate} tasks vs {reach.incumbent} (+{reach.gained}"
            f" / -{reach.lost}, p worse = {reach.p_worse:.3g})"
        )
    if narrower:
        text += ": significantly fewer tasks reached, blocked by promotion.reach_guard"
    return text
