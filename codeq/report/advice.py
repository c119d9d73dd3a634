"""The end of the round report: what to do next, in words that fit the round's outcome, and
whether each warning the round logged matters for this run."""

from __future__ import annotations

from math import comb
from typing import Any

# codeq.pairs.CRITIQUE_SIGNAL_AUC: below it the pairs stage warns that blending the critique
# adds noise (the report may not import codeq.pairs; tests/test_report.py pins the two equal)
CRITIQUE_SIGNAL_AUC = 0.6
# a share of pairs dropped over train.max_length from which the loss is worth acting on
DROPPED_SHARE_THAT_MATTERS = 0.1
MORE_TASKS = (
    "validate on more tasks: a larger task source (DebugBench, from a clone of "
    "github.com/thunlp/DebugBench or the Hugging Face dataset Rtian/DebugBench, see README), "
    "a larger tasks.validation_fraction, or promotion.max_tasks unset (the whole split)"
)


def exact_p(gained: int, lost: int) -> float:
    """The promotion's one-sided exact McNemar p (codeq.promotion.one_sided_mcnemar, which the
    report may not import; tests/test_report.py pins the two equal)."""
    discordant = gained + lost
    if discordant == 0:
        return 1.0
    return sum(comb(discordant, k) for k in range(gained, discordant + 1)) / 2**discordant


def fewest_gains(level: float) -> int:
    """The fewest tasks gained, none lost, that the exact test promotes at `level`."""
    gained = 1
    while exact_p(gained, 0) >= level:
        gained += 1
    return gained


def gains_needed(changed: int, level: float) -> int | None:
    """Of `changed` tasks that changed outcome, how many must be gains to promote (None when
    no split of them passes)."""
    return next((k for k in range(changed + 1) if exact_p(k, changed - k) < level), None)


def what_next(summary: dict[str, Any]) -> list[str]:
    """Paragraphs saying why the round ended as it did and what the next step is."""
    promotion = summary.get("promotion")
    if promotion is None:
        return []
    number = promotion["round"]
    if promotion["promote"]:
        return [_after_promotion(summary, promotion)]
    if not promotion.get("comparisons"):
        if promotion.get("candidate") is None:
            skipped = summary.get("train_skipped") or "no preference pairs"
            return [
                f"Nothing to promote: no adapter was trained in round {number} ({skipped}). "
                "The next round collects again with the same policy; to get pairs, search more "
                "per task (search.rollouts, search.rewrites_per_expansion) or on more train "
                "tasks (a larger task source)."
            ]
        return [
            "Nothing was decided: there are no validation tasks. Set tasks.validation_fraction "
            "above 0 so that a round can be promoted."
        ]
    return [_after_keeping(promotion)]


def _after_promotion(summary: dict[str, Any], promotion: dict[str, Any]) -> str:
    text = (
        f"Promoted: round {promotion['round']}'s candidate is now the run's policy, so the next "
        "round samples its trajectories from it and trains on top of it."
    )
    if promotion.get("forced"):
        text += (
            " The promotion was forced (promotion.force_rounds), not earned on validation: "
            "the next round is measured against a policy the tests did not choose."
        )
    gate = promotion.get("gate_mode")
    test = (summary.get("comparison") or {}).get("modes", {}).get(gate)
    if test:
        text += (
            f" On the test split (reported, never used to decide) it solves "
            f"{test['adapter_solved']} of {test['n']} in {gate} against the incumbent's "
            f"{test['base_solved']} (+{len(test['gained'])} / -{len(test['lost'])})."
        )
    return text


def _after_keeping(promotion: dict[str, Any]) -> str:
    gate = promotion["comparisons"][0]
    level = promotion["level"]
    tasks, gained, lost = gate["tasks"], len(gate["gained"]), len(gate["lost"])
    outcome = f"+{gained} / -{lost} of {tasks} validation tasks in {gate['mode']}"
    counts = gate.get("pass_counts")  # the sign-flip test on pass counts (promotion.samples)
    if counts:
        outcome += (
            f"; with {counts['samples']} sampled answers per task, more passes on "
            f"{counts['tasks_better']} tasks and fewer on {counts['tasks_worse']}"
        )
    worse = [row["mode"] for row in promotion["comparisons"] if row["p_worse"] < level]
    again = "The next round starts from the incumbent again."
    reach = (counts or {}).get("reach")
    if promotion.get("reach_guard") and reach and reach["p_worse"] < level:
        return (
            f"Not promoted: some answer of the candidate passes on {reach['candidate']} "
            f"validation tasks against the incumbent's {reach['incumbent']} (+{reach['gained']} "
            f"/ -{reach['lost']}, p = {reach['p_worse']:.3g}), so a search that answers from many "
            f"samples would find less ({outcome}; promotion.reach_guard). {again} Pairs that "
            "only sharpen what the policy already solves do this: check what this round's "
            "pairs taught."
        )
    if worse:
        return (
            f"Not promoted: the candidate does significantly worse in {', '.join(worse)} "
            f"({outcome}). {again} Check what this round's pairs taught before running more "
            "rounds with these settings."
        )
    # the smallest p any result could give: every changed task going the candidate's way
    room = tasks if counts else tasks - gate["incumbent_solved"]
    if exact_p(room, 0) >= level:
        limit = (
            f"with {tasks} validation tasks, a candidate better on every one of them gets"
            if counts
            else f"the incumbent fails {room} of the {tasks} validation tasks, and "
            "gaining all of them with none lost gives"
        )
        return (
            f"Not promoted, and no candidate could have been: {limit} p = "
            f"{exact_p(room, 0):.3g}, not below {level}; the exact test needs at least "
            f"{fewest_gains(level)} tasks going the candidate's way and none the other "
            f"({outcome} here). {again} To make promotion possible, {MORE_TASKS}. A handful "
            "of tasks exercises the pipeline but cannot show learning: for that, a code model "
            "(e.g. Qwen2.5-Coder-0.5B-Instruct, `--model`; docs/results.md) on DebugBench."
        )
    better, poorer = (counts["tasks_better"], counts["tasks_worse"]) if counts else (gained, lost)
    if better > poorer:
        needed = None if counts else gains_needed(gained + lost, level)
        bar = f"; with {gained + lost} tasks changed, {needed} of them would have to be gains"
        more_evidence = (
            ", more answers per task (promotion.samples, k sampled answers beside the greedy one)"
            if "samples" in promotion and not promotion["samples"]
            else ""
        )
        return (
            f"Not promoted because the validation cannot tell a gain this small from chance: "
            f"{outcome}, p = {gate['p_better']:.3g} (level {level})"
            f"{bar if needed is not None else ''}. {again} To see a gain of this size, "
            f"{MORE_TASKS}{more_evidence}; or make each round's gain larger (more pairs: more "
            "train tasks or rollouts per round)."
        )
    return (
        f"Not promoted: the candidate did no better than the incumbent ({outcome}), so this "
        f"round's pairs did not improve {gate['mode']}. {again} Before more rounds with these "
        "settings, look at the pairs (how many, the warnings below) and at the training's "
        "held-out reward accuracy."
    )


def warnings_here(summary: dict[str, Any]) -> list[dict[str, str]]:
    """The warnings the round's stages log that its outputs show, each with whether it
    matters for this run: [{"warning", "matters"}]."""
    found = []
    pairs, train = summary.get("pairs") or {}, summary.get("train") or {}
    auc, alpha = pairs.get("critique_auc"), pairs.get("alpha")
    critiqued = pairs.get("q_ai") != "verifier"  # a learned verifier gave Q_ai instead
    if (
        critiqued
        and auc is not None
        and alpha is not None
        and alpha < 1.0
        and auc < CRITIQUE_SIGNAL_AUC
    ):
        warning = (
            f"critique AUC {auc:.2f} (0.5 is chance) blended at pairs.alpha={alpha:g}; "
            "the pairs stage suggests pairs.alpha=1.0"
        )
        if pairs.get("pairs"):
            matters = (
                "It matters for this run: the pair values mixed in a critique that does not tell "
                "passing rewrites from failing ones, so siblings with the same test reward were "
                "paired and ordered by the critique alone. Set pairs.alpha=1.0 (test rewards "
                "only) for the next round."
            )
        else:
            matters = "It does not matter for this run: no pairs were built."
        found.append({"warning": warning, "matters": matters})
    counts = train.get("pairs") or {}
    dropped, total = counts.get("dropped_over_max_length") or 0, counts.get("total") or 0
    if dropped and total:
        share = dropped / total
        found.append(
            {
                "warning": f"{dropped} of {total} pairs longer than train.max_length were dropped",
                "matters": (
                    f"It matters for this run: {share:.0%} of the pairs did not train; raise "
                    "train.max_length."
                    if share >= DROPPED_SHARE_THAT_MATTERS
                    else f"It hardly matters for this run ({share:.0%} of the pairs)."
                ),
            }
        )
    if train and not counts.get("held_out"):
        found.append(
            {
                "warning": "no held-out pairs: held-out reward accuracy was not measured and "
                "the last step's adapter was kept",
                "matters": (
                    "It does not change the promotion, which is decided on validation tasks; "
                    "it leaves the training without its check on unseen problems "
                    "(train.eval_fraction is 0, or too few problems to hold one out)."
                ),
            }
        )
    return found
