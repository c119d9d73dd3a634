"""The ledger of paired tests: every comparison of a candidate against a reference on the same
tasks (gained / lost, exact one-sided McNemar; the sign-flip test on pass counts where
promotion.samples decided) that docs/results.md, docs/results-notebook.md,
docs/promotion-power.md or the committed files under docs/results/ report, by split, recounted
from the committed files wherever they hold the per-task answers.

    .venv/bin/python bench/paired_tests.py            # check every entry, print the counts
    .venv/bin/python bench/paired_tests.py --write docs/results/paired-tests.md

The entries were read off the documents by hand (LEDGER); the third curve's rounds are read
off their committed folders (docs/results/learning-curve-defaults/rounds/round-N/). For every
entry backed by per-task files this script recomputes gained and lost and checks them, the
reported p, the split and the task set (the first 40 or the other 103 of the 143 validation
tasks, the first 60 or the other 137 of the 197 test tasks; for a round decided with sampled
answers, the sign-flip p on their pass counts); for one backed by counts only it
checks the net difference; entries with no committed file are counted as read. Every result
file under docs/results/ holding per-task answers or a promotion decision must be in an entry
or listed with a reason (DUPLICATES, NOT_PAIRED), so a new result file fails the check until
the ledger says what it is. --write replaces the generated parts of the ledger page (between
its `<!-- paired_tests.py ... -->` markers) and leaves the prose as it is.
"""

from __future__ import annotations

import argparse
import functools
import json
import lzma
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from compare_evals import figures, headline_name  # noqa: E402
from curve_rounds import read_packed  # noqa: E402

from codeq.evaluate.results import EvalResults  # noqa: E402
from codeq.promotion import ModeComparison, compare_modes, one_sided_mcnemar  # noqa: E402

RESULTS = REPO / "docs" / "results"
PAGE = RESULTS / "paired-tests.md"
SPLITS = {
    "validation": "Validation split (143 tasks)",
    "test60": "Test split, the curves' first 60 tasks",
    "test137": "Test split, the other 137 tasks",
    "test197": "Test split, all 197 tasks pooled (counted in both parts above)",
}
PART_NAMES = {40: "first 40", 103: "other 103", 143: "all 143", 60: "60", 137: "137", 197: "197"}
ROLES = {"decided": "decided", "informed": "informed", "": "reported"}
TASK_BY_TASK = ("recomputed", "decision file")  # backings that give the tasks gained and lost

# the committed files, by name (paths under docs/results/)
LC = "learning-curve/"
BASE, R0 = LC + "base-test.json", LC + "round-0-test.json"
R1C, R2C = LC + "round-1-candidate-test.json", LC + "round-2-candidate-test.json"
REP = LC + "replication/"
R1E, R2E = LC + "round-1-evaluate/", LC + "round-2-evaluate/"
WH = "learning-curve-whole/"
W0E, W1E = WH + "round-0-evaluate/", WH + "round-1-evaluate/"
GPU = LC + "gpu-h200/"
WID, REF, AB = "widening/", "refine/", "prompt-ab/"
DEFAULTS = "learning-curve-defaults/"  # the third curve

NB = "notebook"  # docs/results-notebook.md, section named after it
FR, ZS = "full_rewrite", "zero_shot"


@dataclass(frozen=True)
class Entry:
    """One paired test. `first` and `second` name the candidate's and the reference's answers:
    'path:figure' (a figure of a `codeq evaluate` results file, e.g. 'mcts@8', optionally
    sliced by task position, 'path:figure[40:]'), or 'path#variant' (a bench/prompt_ab.py
    run); several are joined over their tasks (a pooled set). `decision` names files holding
    the gained and lost task ids (round-N.json, decision.json); `counts` two 'path@dotted.key'
    solved counts whose difference must be the net (the tasks themselves not committed)."""

    key: str
    split: str
    tasks: int
    date: str
    what: str
    gained: int
    lost: int
    p: str = ""  # as the document reports it: '0.031', '< 0.001', 'worse 0.344'
    role: str = ""  # decided (by a rule set before), informed (cited for a choice), ''
    outcome: str = ""
    where: str = ""
    first: tuple[str, ...] = ()
    second: tuple[str, ...] = ()
    decision: tuple[str, ...] = ()
    counts: tuple[str, str] | None = None
    note: str = ""
    samples: int = 0  # k > 0: decided with promotion.samples = k; gained / lost stay the greedy
    # answers', the p is the exact sign-flip test on each task's passes among its greedy and k
    # sampled answers, recomputed from `first` and `second` (one results file each)


def e(
    key: str, split: str, tasks: int, date: str, what: str, gl: tuple[int, int], **kw: Any
) -> Entry:
    return Entry(key, split, tasks, date, what, gl[0], gl[1], **kw)


def fig(path: str, figure: str, part: str = "") -> str:
    return f"{path}:{figure}{part}"


def directed_p_text(gained: int, lost: int, p_better: float, p_worse: float) -> str:
    """A comparison's p in its direction: that of a gain where it gained at least as many as
    it lost, else "worse" and that of a loss."""
    from curve_figure import p_text

    return p_text(p_better) if gained >= lost else "worse " + p_text(p_worse)


def exact_p_text(gained: int, lost: int) -> str:
    """The exact one-sided McNemar p of a comparison in its direction."""
    return directed_p_text(
        gained, lost, one_sided_mcnemar(gained, lost), one_sided_mcnemar(lost, gained)
    )


def budgets(
    prefix: str,
    split: str,
    tasks: int,
    date: str,
    what: str,
    rows: list[tuple],
    informed: dict[int, str] | None = None,
    **kw: Any,
) -> list[Entry]:
    """One entry per budget: rows of (label, (gained, lost), p, first spec, second spec);
    `informed` maps a row's number (from 1) to the choice it was cited for."""
    informed = informed or {}
    return [
        e(
            f"{prefix}{i}",
            split,
            tasks,
            date,
            f"{what}, {label}",
            gl,
            p=p,
            first=(first,),
            second=(second,),
            role="informed" if i in informed else "",
            outcome=informed.get(i, ""),
            **kw,
        )
        for i, (label, gl, p, first, second) in enumerate(rows, start=1)
    ]


MCTS_BUDGETS = (1, 2, 4, 8)
BON_OF = {1: 2, 2: 4, 4: 8, 8: 16}

LEDGER: list[Entry] = [
    # ---------------------------------------------------------------- validation split
    e(
        "V1",
        "validation",
        40,
        "2026-11-23",
        "first-turn prompt explain_first vs detailed (base model, greedy full_rewrite)",
        (1, 2),
        p="0.88",
        role="decided",
        outcome="with V2: `search.prompt` default `plain`",
        where=f"{NB}, The first-turn prompt",
        first=(AB + "validation-40.json#explain_first",),
        second=(AB + "validation-40.json#detailed",),
    ),
    e(
        "V2",
        "validation",
        40,
        "2026-11-23",
        "first-turn prompt plain vs detailed (base model, greedy full_rewrite)",
        (7, 0),
        p="0.008",
        role="decided",
        outcome="`search.prompt` default `plain`",
        where=f"{NB}, The first-turn prompt",
        first=(AB + "validation-40.json#plain",),
        second=(AB + "validation-40.json#detailed",),
    ),
    e(
        "V3",
        "validation",
        40,
        "2026-11-25",
        "first curve, round 0 (lr 1e-4) vs base model, full_rewrite",
        (5, 0),
        p="0.031",
        role="decided",
        outcome="round 0 promoted; lr 1e-4 trial kept",
        where="results.md headline; notebook, Round 0",
        decision=(LC + "round-0.json",),
    ),
    e(
        "V4",
        "validation",
        40,
        "2026-11-26",
        "round 0 trained at lr 5e-6 vs base model, full_rewrite (checked after the choice)",
        (0, 1),
        where=f"{NB}, Round 0",
        counts=(
            LC + "learning-rate.json@checked_after_choice.0.validation_solved",
            LC + "learning-rate.json@checked_after_choice.0.validation_incumbent_solved",
        ),
        note="kept out by its trial; changed nothing the curve chose",
    ),
    e(
        "V5",
        "validation",
        40,
        "2026-11-26",
        "round 0 at lr 1e-4 vs at lr 5e-6, full_rewrite",
        (6, 0),
        p="0.016",
        role="decided",
        outcome="`train.learning_rate` default 1e-4 (was 5e-6)",
        where=f"{NB}, Round 0",
        counts=(
            LC + "learning-rate.json@trials.0.validation_solved",
            LC + "learning-rate.json@checked_after_choice.0.validation_solved",
        ),
    ),
    e(
        "V6",
        "validation",
        40,
        "2026-11-25",
        "first curve, round 1 candidate vs round 0, full_rewrite",
        (1, 0),
        p="0.5",
        role="decided",
        outcome="kept out",
        where="results.md headline; notebook, Round 1",
        first=(fig(R1E + "candidate-validation.json", FR),),
        second=(fig(R1E + "incumbent-validation.json", FR),),
        decision=(LC + "round-1.json", R1E + "decision.json"),
    ),
    e(
        "V7",
        "validation",
        40,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, full_rewrite",
        (3, 0),
        p="0.125",
        role="decided",
        outcome="kept out",
        where="results.md headline; notebook, Round 2",
        first=(fig(R2E + "candidate-validation.json", FR),),
        second=(fig(R2E + "incumbent-validation.json", FR),),
        decision=(LC + "round-2.json", R2E + "decision.json"),
    ),
    *budgets(
        "V8.",
        "validation",
        40,
        "2026-11-26",
        "widening 0.5 vs 0, base model MCTS (the curve's search)",
        [
            (
                f"{b} rollout{'s' if b > 1 else ''}",
                gl,
                p,
                fig(WID + "validation-mcts-w0.5.json", f"mcts@{b}"),
                fig(WID + "validation-mcts-w0.json", f"mcts@{b}"),
            )
            for b, gl, p in [(1, (1, 0), "0.50"), (2, (1, 0), "0.50"), (4, (3, 0), "0.125")]
        ],
        where=f"{NB}, Base model on the test split (widening)",
    ),
    e(
        "V8.4",
        "validation",
        40,
        "2026-11-26",
        "widening 0.5 vs 0, base model MCTS (the curve's search), 8 rollouts",
        (4, 1),
        p="0.19",
        role="decided",
        outcome="`search.widening` default 0.5 (rule: more solved at 8 rollouts)",
        where=f"{NB}, Base model on the test split (widening)",
        first=(fig(WID + "validation-mcts-w0.5.json", "mcts@8"),),
        second=(fig(WID + "validation-mcts-w0.json", "mcts@8"),),
    ),
    e(
        "V9",
        "validation",
        40,
        "2026-11-26",
        "one-turn vs multi-turn refinement A/B: the two passes' greedy first turns "
        "(identical requests; a noise check)",
        (2, 1),
        p="0.5",
        where=f"{NB}, The refinement's prompt",
        first=(AB + "validation-40-refine.json#plain_one_turn",),
        second=(AB + "validation-40-refine.json#plain",),
    ),
    *budgets(
        "V10.",
        "validation",
        40,
        "2026-11-26",
        "refinement one_turn vs multi_turn, base model MCTS (plain first turn, widening 0.5)",
        [
            (
                f"{b} rollout{'s' if b > 1 else ''}",
                gl,
                p,
                fig(REF + "validation-mcts-one_turn.json", f"mcts@{b}"),
                fig(REF + "validation-mcts-multi_turn.json", f"mcts@{b}"),
            )
            for b, gl, p in [(1, (1, 2), ""), (2, (1, 2), ""), (4, (4, 2), "0.34")]
        ],
        where=f"{NB}, The refinement's prompt",
    ),
    e(
        "V10.4",
        "validation",
        40,
        "2026-11-26",
        "refinement one_turn vs multi_turn, base model MCTS (plain first turn, widening 0.5), "
        "8 rollouts",
        (3, 0),
        p="0.125",
        role="decided",
        outcome="`search.refine` default `one_turn` (rule: more solved at 8 rollouts)",
        where=f"{NB}, The refinement's prompt",
        first=(fig(REF + "validation-mcts-one_turn.json", "mcts@8"),),
        second=(fig(REF + "validation-mcts-multi_turn.json", "mcts@8"),),
    ),
    e(
        "V11",
        "validation",
        103,
        "2026-11-26",
        "first curve, round 1 candidate vs round 0, full_rewrite",
        (4, 0),
        p="0.0625",
        role="informed",
        outcome="the curve promotes on the whole validation split (with T137-2)",
        where=f"{NB}, The single pass on the other 137 test tasks",
        first=(fig(REP + "validation103-round1-candidate-full_rewrite.json", FR),),
        second=(fig(REP + "validation103-round0-full_rewrite.json", FR),),
    ),
    e(
        "V12",
        "validation",
        143,
        "2026-11-26",
        "first curve, round 1 candidate vs round 0, full_rewrite (V6 and V11 pooled)",
        (5, 0),
        p="0.031",
        role="informed",
        outcome="with V11: cited for the switch to the whole validation split",
        where=f"{NB}, The single pass on the other 137 test tasks",
        first=(
            fig(R1E + "candidate-validation.json", FR),
            fig(REP + "validation103-round1-candidate-full_rewrite.json", FR),
        ),
        second=(
            fig(R1E + "incumbent-validation.json", FR),
            fig(REP + "validation103-round0-full_rewrite.json", FR),
        ),
    ),
    e(
        "V13",
        "validation",
        103,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, full_rewrite",
        (9, 1),
        p="0.011",
        where=f"{NB}, Round 2",
        first=(fig(REP + "validation103-round2-candidate-full_rewrite.json", FR),),
        second=(fig(REP + "validation103-round0-full_rewrite.json", FR),),
    ),
    e(
        "V14",
        "validation",
        143,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, full_rewrite (V7 and V13 pooled)",
        (12, 1),
        p="0.002",
        where=f"{NB}, Round 2",
        first=(
            fig(R2E + "candidate-validation.json", FR),
            fig(REP + "validation103-round2-candidate-full_rewrite.json", FR),
        ),
        second=(
            fig(R2E + "incumbent-validation.json", FR),
            fig(REP + "validation103-round0-full_rewrite.json", FR),
        ),
    ),
    e(
        "V15",
        "validation",
        143,
        "2026-11-26",
        "second curve, round 0 vs base model, full_rewrite",
        (8, 2),
        p="0.055",
        role="decided",
        outcome="kept out",
        where="results.md headline; notebook, A second curve",
        first=(fig(W0E + "candidate-validation.json", FR),),
        second=(fig(W0E + "incumbent-validation.json", FR),),
        decision=(WH + "round-0.json", W0E + "decision.json"),
        note="its first 40 tasks give +5 / -0, V3's result again, not counted twice",
    ),
    e(
        "V16",
        "validation",
        103,
        "2026-11-26",
        "second curve, round 0 vs base model, full_rewrite, V15's other 103 tasks",
        (3, 2),
        where=f"{NB}, A second curve",
        first=(fig(W0E + "candidate-validation.json", FR, "[40:]"),),
        second=(fig(W0E + "incumbent-validation.json", FR, "[40:]"),),
    ),
    e(
        "V17",
        "validation",
        143,
        "2026-11-26",
        "second curve, round 1 vs base model, full_rewrite",
        (16, 5),
        p="0.013",
        role="decided",
        outcome="promoted",
        where="results.md headline; notebook, A second curve",
        first=(fig(W1E + "candidate-validation.json", FR),),
        second=(fig(W1E + "incumbent-validation.json", FR),),
        decision=(WH + "round-1.json", W1E + "decision.json"),
    ),
    e(
        "V18",
        "validation",
        143,
        "2026-11-27",
        "second curve, round 1 vs its round 0 candidate, full_rewrite",
        (9, 4),
        role="informed",
        outcome="calibrates promotion-power's churn (loss per gain 0.3), so k = 8",
        where="promotion-power.md, The model ('+9/-4 on 143 validation tasks')",
        first=(fig(W1E + "candidate-validation.json", FR),),
        second=(fig(W0E + "candidate-validation.json", FR),),
        note="the page does not name the pair; this is the committed pair that gives +9 / -4",
    ),
    # ---------------------------------------------------------------- test, the first 60
    *budgets(
        "T60-1.",
        "test60",
        60,
        "2026-11-23",
        "base model (curve's search): MCTS vs full_rewrite",
        [
            (f"MCTS {b}", gl, p, fig(BASE, f"mcts@{b}"), fig(BASE, FR))
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(3, 0), (5, 0), (7, 0), (7, 0)],
                ["0.125", "0.031", "0.008", "0.008"],
                strict=True,
            )
        ],
        where=f"{NB}, Base model on the test split",
    ),
    *budgets(
        "T60-2.",
        "test60",
        60,
        "2026-11-23",
        "base model (curve's search): MCTS vs zero_shot",
        [
            (f"MCTS {b}", gl, p, fig(BASE, f"mcts@{b}"), fig(BASE, ZS))
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(0, 2), (2, 2), (4, 2), (4, 2)],
                ["1", "0.69", "0.34", "0.34"],
                strict=True,
            )
        ],
        where=f"{NB}, Base model on the test split",
    ),
    *budgets(
        "T60-3.",
        "test60",
        60,
        "2026-11-23",
        "base model (curve's search): best-of-2b vs MCTS at b rollouts",
        [
            (f"best-of-{BON_OF[b]}", gl, p, fig(BASE, f"bon@{BON_OF[b]}"), fig(BASE, f"mcts@{b}"))
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(1, 2), (3, 2), (4, 1), (8, 1)],
                ["0.88", "0.50", "0.19", "0.020"],
                strict=True,
            )
        ],
        informed={4: "progressive widening built (then chosen on validation); issue 37"},
        where="results.md, Search against sampling; notebook, Base model on the test split",
    ),
    *budgets(
        "T60-4.",
        "test60",
        60,
        "2026-11-23",
        "base model (curve's search): best-of-N vs zero_shot",
        [
            (f"best-of-{n}", gl, p, fig(BASE, f"bon@{n}"), fig(BASE, ZS))
            for n, gl, p in zip(
                (2, 4, 8, 16),
                [(1, 4), (4, 3), (7, 2), (11, 2)],
                ["", "", "0.090", "0.011"],
                strict=True,
            )
        ],
        where=f"{NB}, Base model on the test split",
    ),
    *budgets(
        "T60-5.",
        "test60",
        60,
        "2026-11-23",
        "base model (curve's search): best-of-N vs full_rewrite",
        [
            (f"best-of-{n}", gl, p, fig(BASE, f"bon@{n}"), fig(BASE, FR))
            for n, gl, p in zip(
                (2, 4, 8, 16),
                [(3, 1), (6, 0), (10, 0), (14, 0)],
                ["0.31", "0.016", "0.001", "< 0.001"],
                strict=True,
            )
        ],
        where=f"{NB}, Base model on the test split",
    ),
    e(
        "T60-6",
        "test60",
        60,
        "2026-11-25",
        "first curve, round 0 vs base model, full_rewrite",
        (3, 0),
        p="0.125",
        role="informed",
        outcome="the replication on the other 137 was planned after it (not significant)",
        where="results.md headline; notebook, Round 0",
        first=(fig(R0, FR),),
        second=(fig(BASE, FR),),
    ),
    e(
        "T60-7",
        "test60",
        60,
        "2026-11-25",
        "first curve, round 0 vs base model, zero_shot",
        (2, 3),
        p="worse 0.5",
        where="results.md headline; notebook, Round 0 (there p = 0.81, the 'better' side)",
        first=(fig(R0, ZS),),
        second=(fig(BASE, ZS),),
    ),
    e(
        "T60-8",
        "test60",
        60,
        "2026-11-25",
        "first curve, round 1 candidate vs round 0, full_rewrite",
        (3, 0),
        p="0.125",
        where="results.md headline; notebook, Round 1",
        first=(fig(R1C, FR),),
        second=(fig(R0, FR),),
    ),
    e(
        "T60-9",
        "test60",
        60,
        "2026-11-25",
        "first curve, round 1 candidate vs base model, full_rewrite",
        (6, 0),
        p="0.016",
        where=f"{NB}, Round 1",
        first=(fig(R1C, FR),),
        second=(fig(BASE, FR),),
    ),
    e(
        "T60-10",
        "test60",
        60,
        "2026-11-25",
        "first curve, round 1 candidate vs round 0, zero_shot",
        (1, 1),
        p="0.75",
        where="results.md headline; notebook, Round 1",
        first=(fig(R1C, ZS),),
        second=(fig(R0, ZS),),
    ),
    e(
        "T60-11",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, full_rewrite",
        (6, 0),
        p="0.016",
        where="results.md headline; notebook, Round 2",
        first=(fig(R2C, FR),),
        second=(fig(R0, FR),),
    ),
    e(
        "T60-12",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 2 candidate vs base model, full_rewrite",
        (9, 0),
        p="0.002",
        where=f"{NB}, Round 2",
        first=(fig(R2C, FR),),
        second=(fig(BASE, FR),),
    ),
    e(
        "T60-13",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, zero_shot",
        (2, 4),
        p="worse 0.344",
        where="results.md headline; notebook, Round 2",
        first=(fig(R2C, ZS),),
        second=(fig(R0, ZS),),
    ),
    e(
        "T60-14",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 2 candidate vs base model, zero_shot",
        (2, 5),
        role="informed",
        outcome="the zero_shot guard (promotion-power.md: '9 to 6 of 60 twice')",
        where=f"{NB}, Round 2",
        first=(fig(R2C, ZS),),
        second=(fig(BASE, ZS),),
    ),
    e(
        "T60-15",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 2 candidate vs round 1 candidate, full_rewrite",
        (6, 3),
        p="0.25",
        where=f"{NB}, Round 2",
        first=(fig(R2C, FR),),
        second=(fig(R1C, FR),),
    ),
    *budgets(
        "T60-16.",
        "test60",
        60,
        "2026-11-26",
        "base model, curve's search: MCTS widening 0.5 vs 0",
        [
            (
                f"{b} rollout{'s' if b > 1 else ''}",
                gl,
                p,
                fig(WID + "test-mcts-w0.5.json", f"mcts@{b}"),
                fig(BASE, f"mcts@{b}"),
            )
            for b, gl, p in zip(
                MCTS_BUDGETS, [(0, 1), (0, 2), (0, 2), (3, 0)], ["", "", "", "0.125"], strict=True
            )
        ],
        where=f"{NB}, Base model on the test split (widening, on the test split, once)",
    ),
    *budgets(
        "T60-17.",
        "test60",
        60,
        "2026-11-26",
        "base model: best-of-2b vs MCTS widening 0.5 at b rollouts",
        [
            (
                f"best-of-{BON_OF[b]}",
                gl,
                p,
                fig(BASE, f"bon@{BON_OF[b]}"),
                fig(WID + "test-mcts-w0.5.json", f"mcts@{b}"),
            )
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(1, 1), (5, 2), (6, 1), (5, 1)],
                ["", "0.23", "0.06", "0.11"],
                strict=True,
            )
        ],
        where=f"{NB}, Base model on the test split (widening, on the test split, once)",
    ),
    e(
        "T60-18",
        "test60",
        60,
        "2026-11-26",
        "base model: MCTS widening 0.5, 8 rollouts vs zero_shot",
        (7, 2),
        p="0.090",
        where=f"{NB}, Base model on the test split (widening)",
        first=(fig(WID + "test-mcts-w0.5.json", "mcts@8"),),
        second=(fig(BASE, ZS),),
        note="corrected on 2026-11-27, it had quoted the 4-rollout row",
    ),
    e(
        "T60-19",
        "test60",
        60,
        "2026-11-26",
        "base model: MCTS widening 0.5, 8 rollouts vs full_rewrite",
        (10, 0),
        p="0.001",
        where=f"{NB}, Base model on the test split (widening)",
        first=(fig(WID + "test-mcts-w0.5.json", "mcts@8"),),
        second=(fig(BASE, FR),),
    ),
    *budgets(
        "T60-20.",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 0 vs base model (curve's search)",
        [
            (f"MCTS {b}", gl, p, fig(R0, f"mcts@{b}"), fig(BASE, f"mcts@{b}"))
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(5, 3), (8, 4), (9, 4), (11, 4)],
                ["0.36", "0.19", "0.13", "0.059"],
                strict=True,
            )
        ]
        + [
            (f"best-of-{n}", gl, p, fig(R0, f"bon@{n}"), fig(BASE, f"bon@{n}"))
            for n, gl, p in zip(
                (2, 4, 8, 16), [(7, 4), (6, 2), (6, 4), (7, 5)], ["", "", "", "0.39"], strict=True
            )
        ],
        where=f"{NB}, Round 0's policy in the search modes",
    ),
    *budgets(
        "T60-21.",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 0: MCTS at b rollouts vs best-of-2b",
        [
            (f"MCTS {b}", gl, p, fig(R0, f"mcts@{b}"), fig(R0, f"bon@{BON_OF[b]}"))
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(3, 3), (4, 5), (3, 3), (4, 6)],
                ["", "", "", "worse 0.38"],
                strict=True,
            )
        ],
        where="results.md, Search against sampling; notebook, Round 0's policy in the search modes",
    ),
    e(
        "T60-22",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 0: MCTS 8 rollouts vs its zero_shot",
        (12, 2),
        where=f"{NB}, Round 0's policy in the search modes",
        note="the notebook gives p = 0.007; the exact p is 0.0065",
        first=(fig(R0, "mcts@8"),),
        second=(fig(R0, ZS),),
    ),
    e(
        "T60-23",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 0: best-of-16 vs its zero_shot",
        (13, 1),
        p="< 0.001",
        where=f"{NB}, Round 0's policy in the search modes",
        first=(fig(R0, "bon@16"),),
        second=(fig(R0, ZS),),
    ),
    *budgets(
        "T60-24.",
        "test60",
        60,
        "2026-11-26",
        "first curve, round 1 candidate vs round 0",
        [
            (f"best-of-{n}", gl, p, fig(R1C, f"bon@{n}"), fig(R0, f"bon@{n}"))
            for n, gl, p in zip(
                (2, 4, 8, 16),
                [(4, 4), (3, 5), (2, 5), (3, 7)],
                ["", "", "", "worse 0.17"],
                strict=True,
            )
        ],
        where=f"{NB}, Round 1's candidate in the search modes",
    ),
    e(
        "T60-25",
        "test60",
        60,
        "2026-11-26",
        "second curve, round 1 vs base model, full_rewrite",
        (10, 1),
        p="0.006",
        where="results.md headline; notebook, A second curve",
        first=(fig(WH + "round-1-test.json", FR),),
        second=(fig(BASE, FR),),
    ),
    e(
        "T60-26",
        "test60",
        60,
        "2026-11-26",
        "second curve, round 1 vs base model, zero_shot",
        (2, 5),
        p="worse 0.227",
        role="informed",
        outcome="the zero_shot guard (promotion-power.md: '9 to 6 of 60 twice')",
        where="results.md headline; notebook, A second curve",
        first=(fig(WH + "round-1-test.json", ZS),),
        second=(fig(BASE, ZS),),
    ),
    e(
        "T60-27",
        "test60",
        60,
        "2026-11-26",
        "on an H200: first curve, round 0 vs base model, full_rewrite",
        (2, 0),
        p="0.25",
        where=f"{NB}, The same evaluation on a GPU",
        first=(fig(GPU + "round-0-full_rewrite.json", FR),),
        second=(fig(GPU + "base-full_rewrite.json", FR),),
    ),
    e(
        "T60-28",
        "test60",
        60,
        "2026-11-26",
        "on an H200: first curve, round 0 vs base model, zero_shot",
        (2, 2),
        p="0.69",
        where=f"{NB}, The same evaluation on a GPU",
        first=(fig(GPU + "round-0-zero_shot.json", ZS),),
        second=(fig(GPU + "base-zero_shot.json", ZS),),
    ),
    *budgets(
        "T60-29.",
        "test60",
        60,
        "2026-11-26",
        "base model, today's search defaults: MCTS at b rollouts vs best-of-2b",
        [
            (
                f"MCTS {b}",
                gl,
                p,
                fig(REF + "test-mcts.json", f"mcts@{b}"),
                fig(REF + "test-bon16.json", f"bon@{BON_OF[b]}"),
            )
            for b, gl, p in zip(
                MCTS_BUDGETS,
                [(0, 4), (1, 7), (4, 8), (5, 11)],
                ["", "", "", "worse 0.105"],
                strict=True,
            )
        ],
        informed={4: "issue 37 (multi-turn best-of-N, a learned verifier)"},
        where="results.md, Search against sampling; notebook, Today's defaults on the test split",
    ),
    e(
        "T60-30",
        "test60",
        60,
        "2026-11-26",
        "base model, today's search defaults: MCTS 8 rollouts vs best-of-8",
        (6, 6),
        where=f"{NB}, Today's defaults on the test split",
        first=(fig(REF + "test-mcts.json", "mcts@8"),),
        second=(fig(REF + "test-bon16.json", "bon@8"),),
    ),
    e(
        "T60-31",
        "test60",
        60,
        "2026-11-26",
        "base model, MCTS 8 rollouts: today's search defaults vs the curve's search",
        (10, 3),
        p="0.046",
        where=f"{NB}, Today's defaults on the test split",
        first=(fig(REF + "test-mcts.json", "mcts@8"),),
        second=(fig(BASE, "mcts@8"),),
    ),
    e(
        "T60-32",
        "test60",
        60,
        "2026-11-26",
        "base model, MCTS 8 rollouts: today's search defaults vs widening 0.5 alone",
        (8, 4),
        where=f"{NB}, Today's defaults on the test split",
        first=(fig(REF + "test-mcts.json", "mcts@8"),),
        second=(fig(WID + "test-mcts-w0.5.json", "mcts@8"),),
    ),
    e(
        "T60-33",
        "test60",
        60,
        "2026-11-26",
        "base model, best-of-16: plain first turn vs detailed",
        (9, 3),
        p="0.073",
        where=f"{NB}, Today's defaults on the test split",
        first=(fig(REF + "test-bon16.json", "bon@16"),),
        second=(fig(BASE, "bon@16"),),
    ),
    # ---------------------------------------------------------------- test, the other 137
    e(
        "T137-1",
        "test137",
        137,
        "2026-11-26",
        "first curve, round 0 vs base model, full_rewrite",
        (9, 1),
        p="0.011",
        role="informed",
        outcome="promotion-power's churn calibration",
        where="results.md, the 137 test tasks; notebook, The single pass on the other 137",
        first=(fig(REP + "test137-round0-full_rewrite.json", FR),),
        second=(fig(REP + "test137-base-full_rewrite.json", FR),),
    ),
    e(
        "T137-2",
        "test137",
        137,
        "2026-11-26",
        "first curve, round 1 candidate vs round 0, full_rewrite",
        (6, 0),
        p="0.016",
        role="informed",
        outcome="the curve promotes on the whole validation split; promotion-power; issue 37",
        where="results.md, the 137 test tasks; notebook, The single pass on the other 137",
        first=(fig(REP + "test137-round1-candidate-full_rewrite.json", FR),),
        second=(fig(REP + "test137-round0-full_rewrite.json", FR),),
    ),
    e(
        "T137-3",
        "test137",
        137,
        "2026-11-26",
        "first curve, round 0 vs base model, zero_shot",
        (11, 6),
        p="0.17",
        where=f"{NB}, The single pass on the other 137",
        first=(fig(REP + "test137-round0-zero_shot.json", ZS),),
        second=(fig(REP + "test137-base-zero_shot.json", ZS),),
    ),
    e(
        "T137-4",
        "test137",
        137,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, full_rewrite (added after round 2 finished)",
        (21, 7),
        p="0.006",
        role="informed",
        outcome="promotion-power's churn calibration; issue 37; the 7B settings",
        where="results.md, the 137 test tasks; notebook, The single pass on the other 137",
        first=(fig(REP + "test137-round2-candidate-full_rewrite.json", FR),),
        second=(fig(REP + "test137-round0-full_rewrite.json", FR),),
    ),
    e(
        "T137-5",
        "test137",
        137,
        "2026-11-26",
        "first curve, round 2 candidate vs base model, full_rewrite",
        (27, 5),
        where=f"{NB}, The single pass on the other 137",
        first=(fig(REP + "test137-round2-candidate-full_rewrite.json", FR),),
        second=(fig(REP + "test137-base-full_rewrite.json", FR),),
    ),
    e(
        "T137-6",
        "test137",
        137,
        "2026-11-26",
        "first curve, round 2 candidate vs round 1 candidate, full_rewrite",
        (16, 8),
        p="0.076",
        role="informed",
        outcome="promotion-power's churn calibration",
        where=f"{NB}, The single pass on the other 137",
        first=(fig(REP + "test137-round2-candidate-full_rewrite.json", FR),),
        second=(fig(REP + "test137-round1-candidate-full_rewrite.json", FR),),
    ),
    # ---------------------------------------------------------------- test, all 197 pooled
    e(
        "T197-1",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 0 vs base model, full_rewrite (T60-6 and T137-1 pooled)",
        (12, 1),
        p="0.002",
        where=f"{NB}, status and The single pass on the other 137",
        first=(fig(R0, FR), fig(REP + "test137-round0-full_rewrite.json", FR)),
        second=(fig(BASE, FR), fig(REP + "test137-base-full_rewrite.json", FR)),
    ),
    e(
        "T197-2",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 0 vs base model, zero_shot (T60-7 and T137-3 pooled)",
        (13, 9),
        p="0.26",
        where=f"{NB}, The single pass on the other 137",
        first=(fig(R0, ZS), fig(REP + "test137-round0-zero_shot.json", ZS)),
        second=(fig(BASE, ZS), fig(REP + "test137-base-zero_shot.json", ZS)),
    ),
    e(
        "T197-3",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 1 candidate vs round 0, full_rewrite",
        (9, 0),
        p="0.002",
        where=f"{NB}, The single pass on the other 137",
        first=(fig(R1C, FR), fig(REP + "test137-round1-candidate-full_rewrite.json", FR)),
        second=(fig(R0, FR), fig(REP + "test137-round0-full_rewrite.json", FR)),
    ),
    e(
        "T197-4",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 1 candidate vs base model, full_rewrite",
        (21, 1),
        where=f"{NB}, The single pass on the other 137",
        first=(fig(R1C, FR), fig(REP + "test137-round1-candidate-full_rewrite.json", FR)),
        second=(fig(BASE, FR), fig(REP + "test137-base-full_rewrite.json", FR)),
    ),
    e(
        "T197-5",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 2 candidate vs round 0, full_rewrite",
        (27, 7),
        p="< 0.001",
        where=f"{NB}, The single pass on the other 137",
        first=(fig(R2C, FR), fig(REP + "test137-round2-candidate-full_rewrite.json", FR)),
        second=(fig(R0, FR), fig(REP + "test137-round0-full_rewrite.json", FR)),
    ),
    e(
        "T197-6",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 2 candidate vs base model, full_rewrite",
        (36, 5),
        where=f"{NB}, The single pass on the other 137",
        first=(fig(R2C, FR), fig(REP + "test137-round2-candidate-full_rewrite.json", FR)),
        second=(fig(BASE, FR), fig(REP + "test137-base-full_rewrite.json", FR)),
    ),
    e(
        "T197-7",
        "test197",
        197,
        "2026-11-26",
        "first curve, round 2 candidate vs round 1 candidate, full_rewrite",
        (22, 11),
        p="0.040",
        where=f"{NB}, The single pass on the other 137",
        first=(fig(R2C, FR), fig(REP + "test137-round2-candidate-full_rewrite.json", FR)),
        second=(fig(R1C, FR), fig(REP + "test137-round1-candidate-full_rewrite.json", FR)),
    ),
]

# result files that hold the same answers as a file an entry uses (checked task by task)
DUPLICATES = {
    WH + "base-test.json": BASE,
    WH + "round-0-candidate-test.json": R0,
    R1E + "candidate-test.json": R1C,
    R1E + "incumbent-test.json": R0,
    R2E + "candidate-test.json": R2C,
    R2E + "incumbent-test.json": R0,
    # measured again on a fresh machine (2026-12-06, bench/retest_single_pass.py's way): the same
    # program for every task as the 2026-11-29 rows, and the same completion tokens
    DEFAULTS + "retest/2026-12-06-base.json": DEFAULTS + "base-test.json",
    DEFAULTS + "retest/2026-12-06-round-3-1.json": DEFAULTS + "round-3-test.json",
    DEFAULTS + "retest/2026-12-06-round-3-2.json": DEFAULTS + "round-3-test.json",
    W0E + "candidate-test.json": R0,
    W0E + "incumbent-test.json": BASE,
    W1E + "candidate-test.json": WH + "round-1-test.json",
    W1E + "incumbent-test.json": BASE,
}
# per-task files that no counted comparison uses, and why
NOT_PAIRED: dict[str, str] = {
    # round 8's prepare built another first 60 test tasks (21 of 60 differ from the spent set;
    # its validation tasks are the same 143), so its report's test comparison is not a T60 entry
    "learning-curve-defaults/rounds/round-8/store/runs/curve-lr0.0001/round-8/eval/candidate/test/results.json": "third curve round 8: test tasks not the spent 60",
    "learning-curve-defaults/rounds/round-8/store/runs/curve-lr0.0001/round-8/eval/incumbent/test/results.json": "third curve round 8: test tasks not the spent 60",
    # round-3-test.json (2026-11-29) evaluated again on 2026-12-05: 42 solved, not 38 (+7 / -3).
    # On a fresh machine on 2026-12-06 round 3 twice in one process and the base model gave the
    # 2026-11-29 rows exactly (DUPLICATES above), so this row is the one that does not
    # reproduce; nothing is paired against it
    "learning-curve-defaults/round-3-test-again.json": "third curve round 3's 137-task single pass of 2026-12-05, which did not reproduce (retest/)",
}


# ------------------------------------------------------------------ reading the files


@functools.cache
def read(path: str) -> Any:
    """A committed result file (its xz copy where a round's was packed: curve_rounds.pack)."""
    return json.loads(read_packed(RESULTS / path))


def answers(spec: str) -> tuple[str, dict[str, bool]]:
    """(split, task -> solved) of one answer set named as in Entry."""
    if "#" in spec:
        path, variant = spec.split("#")
        runs = {run["variant"]: run for run in read(path)["runs"]}
        return "validation", {t["task_id"]: bool(t["solved"]) for t in runs[variant]["tasks"]}
    path, name = spec.split(":", 1)
    part = re.fullmatch(r"(.+?)(?:\[(\d*):(\d*)\])?", name)
    assert part is not None
    figure, start, stop = part.groups()
    results = read(path)
    per_task = figures(results)[figure]["per_task"]
    ids = results["task_ids"][int(start or 0) : int(stop) if stop else None]
    return results["split"], {task: bool(per_task[task]) for task in ids}


def joined(specs: tuple[str, ...]) -> tuple[str, dict[str, bool]]:
    splits: set[str] = set()
    merged: dict[str, bool] = {}
    for spec in specs:
        split, solved = answers(spec)
        splits.add(split)
        if set(solved) & set(merged):
            raise ValueError(f"{spec}: tasks overlap the other parts")
        merged.update(solved)
    if len(splits) != 1:
        raise ValueError(f"{specs}: parts from different splits {sorted(splits)}")
    return splits.pop(), merged


def dotted(spec: str) -> int:
    path, key = spec.split("@")
    value: Any = read(path)
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return int(value)


def decision_ids(path: str) -> tuple[list[str], list[str], int]:
    path, _, part = path.partition("#")
    data = read(path)
    if part:  # bench/answer_selection.py: 'file#forest#index' names one of its comparisons
        forest, index = part.split("#")
        comparison = data["forests"][forest]["comparisons"][int(index)]
        tasks = data["forests"][forest]["trees"]
        return comparison["gained_tasks"], comparison["lost_tasks"], tasks
    if data.get("search_validation"):  # bench/verifier_auc.py: the answers its tie-break chose
        answers = next(iter(data["search_validation"]["answers"].values()))
        return answers["gained"], answers["lost"], answers["tasks"]
    comparison = (data.get("comparisons") or data.get("validation"))[0]
    return comparison["gained"], comparison["lost"], comparison["tasks"]


def task_sets() -> dict[tuple[str, int], list[str]]:
    """The task set each (split, tasks) of the ledger must be, from the committed files."""
    validation = read(W0E + "incumbent-validation.json")["task_ids"]
    first, other = read(BASE)["task_ids"], read(REP + "test137-base-full_rewrite.json")["task_ids"]
    return {
        ("validation", 40): validation[:40],
        ("validation", 103): validation[40:],
        ("validation", 143): validation,
        ("test60", 60): first,
        ("test137", 137): other,
        ("test197", 197): first + other,
    }


# ------------------------------------------------------------------ the third curve's rounds


def defaults_rounds() -> list[Entry]:
    """Two entries per committed round of the third curve: its promotion decision on
    validation and its report's candidate-against-incumbent comparison on the first 60 test
    tasks."""
    found = []
    folder = RESULTS / DEFAULTS / "rounds"
    numbered = sorted(
        (int(m.group(1)), path)
        for path in folder.glob("round-*")
        if (m := re.fullmatch(r"round-(\d+)", path.name))
    )
    for number, path in numbered:
        for run in sorted((path / "store" / "runs").glob(f"*/round-{number}/promote")):
            rel = run.parent.relative_to(RESULTS).as_posix()
            decision = read(f"{rel}/promote/decision.json")
            done = read(f"{rel}/promote/_COMPLETE")["completed_at"][:10]
            summary = f"{DEFAULTS}round-{number}.json"  # the curve's copy of the decision
            incumbent = decision["incumbent"]["adapters"]
            reference = f"round {incumbent[-1]['round']}'s policy" if incumbent else "base model"
            gate = decision["comparisons"][0]
            gained, lost = (len(gate[k]) for k in ("gained", "lost"))
            mode = decision["gate_mode"]
            what = f"third curve, round {number} vs {reference}, {mode}"
            samples = decision.get("samples", 0)
            counts = gate.get("pass_counts")
            sampled_note = (
                f"greedy answers' gained / lost; decided by the sign-flip test on "
                f"{samples + 1} answers a task: more passes on {counts['tasks_better']} tasks, "
                f"fewer on {counts['tasks_worse']}"
                if samples
                else ""
            )
            found.append(
                e(
                    f"V-d{number}",
                    "validation",
                    decision["comparisons"][0]["tasks"],
                    done,
                    what,
                    (gained, lost),
                    p=f"{decision['comparisons'][0]['p_better']:.3g}",
                    role="decided",
                    outcome="promoted" if decision["promote"] else "kept out",
                    where="results.md, The third curve",
                    first=(fig(f"{rel}/eval/candidate/validation/results.json", mode),),
                    second=(fig(f"{rel}/eval/incumbent/validation/results.json", mode),),
                    decision=(f"{rel}/promote/decision.json",)
                    + ((summary,) if (RESULTS / summary).is_file() else ()),
                    samples=samples,
                    note=sampled_note,
                )
            )
            test = [f"{rel}/eval/{role}/test/results.json" for role in ("candidate", "incumbent")]
            if all((RESULTS / t).is_file() for t in test):
                _, cand = answers(fig(test[0], mode))
                _, inc = answers(fig(test[1], mode))
                if set(cand) != set(task_sets()[("test60", 60)]):
                    # round 8's prepare built another first 60 test tasks (21 differ): its
                    # report compares on those, which are not the spent set; not a T60 entry
                    continue
                found.append(
                    e(
                        f"T60-d{number}",
                        "test60",
                        len(cand),
                        done,
                        what + " (the round's report, 'Base vs adapter')",
                        (
                            sum(cand[t] and not inc[t] for t in cand),
                            sum(inc[t] and not cand[t] for t in cand),
                        ),
                        where=f"`{short(rel)}/report/report.md`",
                        first=(fig(test[0], mode),),
                        second=(fig(test[1], mode),),
                        note="computed by the product's report stage; not quoted in the docs",
                    )
                )
    return found


MEASUREMENT_BEGAN = "2026-11-29"  # the third curve's test measurement (--test-after-chain)


def same_answers(row: dict[str, Any], rows: list[dict[str, Any]], mode: str) -> bool:
    """Whether both policies of a row's pairing answered every task in `mode` exactly as in
    full_rewrite: under search.prompt 'plain' (today's default) the two modes send the same
    greedy request, so their pairing is full_rewrite's again."""
    incumbent = next(r for r in rows if r["name"] == row["incumbent"])
    return all(
        (modes := r["results"].modes)[mode].per_task == modes["full_rewrite"].per_task
        and modes[mode].completion_tokens == modes["full_rewrite"].completion_tokens
        for r in (row, incumbent)
    )


def defaults_measurement() -> list[dict[str, Any]]:
    """The third curve's test measurement as bench/curve_figure.py loads it for its table."""
    from curve_figure import load_defaults_curve, load_test_measurement

    return load_test_measurement(RESULTS / DEFAULTS, load_defaults_curve(RESULTS / DEFAULTS))


def defaults_test_measurement() -> list[Entry]:
    """One entry per mode each measured policy of the third curve's test measurement shares
    with the policy its round was meant to replace, on the 137 test tasks no decision used
    (bench/curve_figure.py's table on docs/results.md)."""
    rows = defaults_measurement()
    labels = {row["name"]: row["label"] for row in rows}
    files = {row["name"]: DEFAULTS + row["file"] for row in rows}
    found = []
    for row in rows:
        for mode, paired in row["test_vs"].items():
            if mode != "full_rewrite" and same_answers(row, rows, mode):
                continue  # the same programs as full_rewrite's: one test, counted once
            against = labels[row["incumbent"]]
            gained, lost = len(paired.gained), len(paired.lost)
            p = directed_p_text(gained, lost, paired.p_better, paired.p_worse)
            kept = "" if row["promoted"] else ", kept out by validation"
            found.append(
                e(
                    f"T137-d-{row['name']}-{mode}",
                    "test137",
                    paired.tasks,
                    MEASUREMENT_BEGAN,
                    f"third curve, {row['label']}{kept} vs {against}, {mode} (test measurement)",
                    (gained, lost),
                    p=p,
                    where="results.md, Headline (the third curve's test measurement)",
                    first=(fig(files[row["name"]], mode),),
                    second=(fig(files[row["incumbent"]], mode),),
                )
            )
    return found


SEARCH_MODES = "search-modes/"


def headline(path: str, mode: str) -> str:
    """`mode`'s headline figure in a results file, named as figures() names it (by budget)."""
    return fig(path, headline_name(mode, read(path)["modes"][mode]))


# The test-split figures that prompted a later choice (the choice itself rests on validation)
SEARCH_TEST_RUN_INFORMED = {
    f"T137-dsm-round-16-{mode}": "prompted reach in every decision and the opt-in "
    "promotion.reach_guard (validation: round 16 reached 62 tasks against 69; "
    "docs/promotion-power.md, Reach)"
    for mode in ("bon", "mcts")
}


def defaults_search_test_run() -> list[Entry]:
    """One entry per search each promoted policy's search modes' test run shares with the run
    of the policy its round was meant to replace, on the same 137 test tasks (the searches'
    columns of bench/curve_figure.py's table on docs/results.md)."""
    from curve_figure import load_search_test_run

    rows = load_search_test_run(RESULTS / SEARCH_MODES, defaults_measurement())
    by_name = {row["name"]: row for row in rows}
    found = []
    for row in rows:
        if not row["search_vs"]:  # the replaced policy's run is not in yet
            continue
        record = read(f"{SEARCH_MODES}{row['name']}-test.json")
        against = by_name[row["incumbent"]]
        for mode, paired in row["search_vs"].items():
            gained, lost = len(paired.gained), len(paired.lost)
            key = f"T137-dsm-{row['name']}-{mode}"
            found.append(
                e(
                    key,
                    "test137",
                    paired.tasks,
                    record["date"],
                    f"third curve, {row['label']} vs {against['label']}, "
                    f"{row['search_labels'][mode]} (search modes' test run)",
                    (gained, lost),
                    p=directed_p_text(gained, lost, paired.p_better, paired.p_worse),
                    role="informed" if key in SEARCH_TEST_RUN_INFORMED else "",
                    outcome=SEARCH_TEST_RUN_INFORMED.get(key, ""),
                    where="results.md, The third curve's policies searching",
                    first=(headline(f"{SEARCH_MODES}{row['name']}-test-results.json", mode),),
                    second=(headline(f"{SEARCH_MODES}{row['incumbent']}-test-results.json", mode),),
                )
            )
    return found


def search_modes_entries(paths: list[str] | None = None) -> list[Entry]:
    """One entry per row of each bench/search_modes.py run (searches at equal programs): on
    validation, the rows at the full budget against best-of-N decide issue 37's choice of
    search (its verdict), the smaller budgets and MCTS against multi-turn are reported; a
    --test-run's rows (`*-test.json`) are all reported, and so is, per search, its answers
    chosen by agreement then the kept verifier against the critique's from the same trees."""

    if paths is None:
        paths = [
            path.relative_to(RESULTS).as_posix()
            for pattern in ("*-validation.json", "*-test.json")
            for path in sorted((RESULTS / SEARCH_MODES).glob(pattern))
        ]
    found = []
    for path in paths:
        run = read(path)
        results = str(Path(path).with_name(run["results"]).as_posix())
        full = f"bon@{run['programs_at_most']}"
        on_test = run["split"] == "test"
        for number, row in enumerate(run["rows"], start=1):
            gained, lost = len(row["gained"]), len(row["lost"])
            decides = row["second"] == full and not on_test
            found.append(
                e(
                    f"{'T' if on_test else 'V'}{row['tasks']}-sm-{Path(path).stem}-{number}",
                    f"test{row['tasks']}" if on_test else "validation",
                    row["tasks"],
                    run["date"],
                    f"search modes at equal programs ({Path(path).stem}), {row['mode']}",
                    (gained, lost),
                    p=directed_p_text(gained, lost, row["p_better"], row["p_worse"]),
                    role="decided" if decides else "",
                    outcome=run["verdict"] if decides else "",
                    where="results/search-modes/README.md",
                    first=(fig(results, row["first"]),),
                    second=(fig(results, row["second"]),),
                )
            )
        found += verifier_test_entries(path, run)
    return found


def verifier_test_entries(path: str, run: dict[str, Any]) -> list[Entry]:
    """A search modes' --test-run: per search, its answers by agreement then the kept verifier
    against the critique's from the same trees (the verifier decision's one test run)."""

    found = []
    for forest, measured in (run.get("forests") or {}).items():
        index = len(measured["comparisons"]) - 1  # the run appends this comparison last
        comparison = measured["comparisons"][index]
        gained, lost = comparison["gained"], comparison["lost"]
        found.append(
            e(
                f"T{measured['trees']}-sm-{Path(path).stem}-{forest}-verifier",
                f"test{measured['trees']}",
                measured["trees"],
                run["date"],
                f"search modes' test run ({Path(path).stem}), {forest}: "
                f"{comparison['other']} vs {comparison['baseline']}",
                (gained, lost),
                p=exact_p_text(gained, lost),
                where="results/search-modes/README.md",
                decision=(f"{path}#{forest}#{index}",),
            )
        )
    return found


VERIFIER = "verifier/"


def verifier_entries() -> list[Entry]:
    """One entry per bench/verifier_auc.py run that chose a search's validation answers again
    with the learned verifier breaking the ties at the top of the visible tests, against the
    self-critique's choice: the declared rule (its `decision`) decided whether the verifier
    replaces the critique."""

    found = []
    for path in sorted((RESULTS / VERIFIER).glob("*.json")):
        run = read(path.relative_to(RESULTS).as_posix())
        if not run.get("search_validation"):
            continue
        name = path.relative_to(RESULTS).as_posix()
        gained, lost, tasks = decision_ids(name)
        settings = ", ".join(f"`{k}` {v}" for k, v in run["decision"]["settings"].items())
        found.append(
            e(
                f"V{tasks}-verifier-{path.stem}",
                "validation",
                tasks,
                run["date"],
                "best-of-16's answers chosen again: the learned verifier breaking ties vs the "
                "self-critique",
                (len(gained), len(lost)),
                p=exact_p_text(len(gained), len(lost)),
                role="decided",
                outcome=(
                    "verifier replaces the critique: "
                    if run["decision"]["replaces_critique"]
                    else "critique stays: "
                )
                + settings,
                where="results/verifier/README.md",
                decision=(name,),
            )
        )
    return found


ANSWER_SELECTION = "answer-selection/"


def answer_selection_entries() -> list[Entry]:
    """One entry per comparison of each bench/answer_selection.py run, in the order they ran:
    a search's validation answers chosen again one way against another. A comparison an
    earlier run made already (the same forest, the same two selectors: recomputed beside the
    new ones) is counted once, and the verifier against the critique is the verifier
    decision's comparison, counted there. The comparisons each run's declared rule reads
    decided `evaluate.agreement_probes` (best-of-16, agreement then the verifier against the
    verifier), how agreement ranks (answered probes first against group size alone), how
    many probes it runs (answered then the verifier at one count against another, a third run
    paired against its --baseline) and what orders its equal groups (the smallest change to
    the buggy program, then the verifier, against the verifier alone)."""

    runs = [
        (read(path.relative_to(RESULTS).as_posix()), path)
        for path in (RESULTS / ANSWER_SELECTION).glob("*.json")
    ]
    seen: set[tuple[str, str, str]] = set()
    found = []
    for run, path in sorted(runs, key=lambda item: (item[0]["date"], item[1].name)):
        name = path.relative_to(RESULTS).as_posix()
        for forest, measured in run["forests"].items():
            for index, comparison in enumerate(measured["comparisons"]):
                pair = (forest, comparison["baseline"], comparison["other"])
                if pair in seen or pair[1:] == ("critique", "verifier"):
                    continue
                seen.add(pair)
                gained, lost = comparison["gained"], comparison["lost"]
                outcome = decided_outcome(run, forest, comparison)
                found.append(
                    e(
                        f"V{measured['trees']}-select-{path.stem}-{forest}-{index}",
                        "validation",
                        measured["trees"],
                        run["date"],
                        f"{forest}'s answers chosen again: {comparison['other']} vs "
                        f"{comparison['baseline']}",
                        (gained, lost),
                        p=exact_p_text(gained, lost),
                        role="decided" if outcome else "",
                        outcome=outcome or "",
                        where="results/answer-selection/README.md",
                        decision=(f"{name}#{forest}#{index}",),
                    )
                )
    return found


def decided_outcome(run: dict[str, Any], forest: str, comparison: dict[str, Any]) -> str | None:
    """What a run's declared rule decided, where `comparison` is the one it reads."""
    if forest != "bon":
        return None
    pair = (comparison["baseline"], comparison["other"])
    if pair == ("verifier", "agreement+verifier") and run.get("decision"):
        adopted = run["decision"]["adopt"]
        return (
            f"`evaluate.agreement_probes` {run['args']['probes']}"
            if adopted
            else "agreement stays off"
        )
    if pair == ("agreement+verifier", "answered+verifier") and run.get("answered_decision"):
        adopted = run["answered_decision"]["adopt"]
        return (
            "agreement ranks answered probes first" if adopted else "agreement ranks by group size"
        )
    if pair == ("answered+verifier", "answered+nearest+verifier") and run.get("nearest_decision"):
        adopted = run["nearest_decision"]["adopt"]
        return (
            "agreement's equal groups ordered by the smallest change first"
            if adopted
            else "agreement's equal groups ordered by the scorer"
        )
    probes = run.get("probes_decision")
    if probes and pair[0].startswith("answered+verifier@"):
        before = pair[0].split("@")[1]
        kept = before if not probes["adopt"] else str(probes["probes"])
        return f"`evaluate.agreement_probes` {kept}"
    return None


def ledger() -> list[Entry]:
    return (
        LEDGER
        + defaults_rounds()
        + defaults_test_measurement()
        + defaults_search_test_run()
        + search_modes_entries()
        + verifier_entries()
        + answer_selection_entries()
    )


# ------------------------------------------------------------------ checks


def p_values(entry: Entry) -> tuple[float, float]:
    if entry.samples:
        paired = pass_count_test(entry)
        return paired.p_better, paired.p_worse
    return one_sided_mcnemar(entry.gained, entry.lost), one_sided_mcnemar(entry.lost, entry.gained)


@functools.cache  # checked, then written (its p and its direction): computed once
def pass_count_test(entry: Entry) -> ModeComparison:
    """The sign-flip test of an entry decided with sampled answers, from its two files."""
    (first,), (second,) = entry.first, entry.second
    (path_a, mode), (path_b, _) = first.split(":", 1), second.split(":", 1)
    candidate, reference = (EvalResults.model_validate(read(path)) for path in (path_a, path_b))
    return compare_modes(mode, candidate.modes[mode], reference.modes[mode], entry.samples)


def net_loss(entry: Entry) -> bool:
    """Whether the candidate came out behind: fewer passing answers under the sign-flip
    test, more tasks lost than gained under McNemar."""
    if entry.samples:
        counts = pass_count_test(entry).pass_counts
        assert counts is not None
        return counts.candidate_passes < counts.incumbent_passes
    return entry.lost > entry.gained


def p_matches(reported: str, better: float, worse: float) -> bool:
    text = reported.removeprefix("worse ").strip()
    if text.startswith("<"):
        return min(better, worse) < float(text[1:])
    decimals = len(text.split(".")[1]) if "." in text else 0
    tolerance = 0.5 * 10**-decimals + 1e-9
    value = float(text)
    side = worse if reported.startswith("worse") else better
    return abs(value - side) <= tolerance


def check_entry(entry: Entry, sets: dict[tuple[str, int], list[str]]) -> tuple[str, list[str]]:
    """(how the entry is backed, problems found)."""
    problems: list[str] = []
    want = sets.get((entry.split, entry.tasks))
    split_name = "validation" if entry.split == "validation" else "test"
    if want is None:
        problems.append(f"no task set for {entry.split} with {entry.tasks} tasks")
    if entry.p and not p_matches(entry.p, *p_values(entry)):
        problems.append(f"reported p {entry.p} is not the exact p {p_values(entry)}")
    backing = "no committed file"
    if entry.first:
        backing = "recomputed"
        (split_a, a), (split_b, b) = joined(entry.first), joined(entry.second)
        if {split_a, split_b} != {split_name}:
            problems.append(f"files are on {split_a}/{split_b}, not {split_name}")
        if set(a) != set(b) or (want is not None and set(a) != set(want)):
            problems.append("the two answer sets are not on the ledger's task set")
        gained = sum(a[t] and not b[t] for t in a)
        lost = sum(b[t] and not a[t] for t in a)
        if (gained, lost) != (entry.gained, entry.lost):
            problems.append(f"files give +{gained} / -{lost}")
    for path in entry.decision:
        backing = "recomputed" if entry.first else "decision file"
        gained_ids, lost_ids, tasks = decision_ids(path)
        if (len(gained_ids), len(lost_ids), tasks) != (entry.gained, entry.lost, entry.tasks):
            problems.append(f"{path} gives +{len(gained_ids)} / -{len(lost_ids)} of {tasks}")
        if want is not None and not set(gained_ids + lost_ids) <= set(want):
            problems.append(f"{path}: tasks outside the ledger's task set")
    if entry.counts:
        backing = "net from counts"
        net = dotted(entry.counts[0]) - dotted(entry.counts[1])
        if net != entry.gained - entry.lost:
            problems.append(f"counts give a net of {net}")
    return backing, [f"{entry.key}: {problem}" for problem in problems]


def referenced(entries: list[Entry]) -> set[str]:
    used = set(DUPLICATES) | set(NOT_PAIRED)
    for entry in entries:
        for spec in entry.first + entry.second:
            used.add(re.split(r"[:#]", spec)[0])
        used.update(spec.split("#")[0] for spec in entry.decision)
        if entry.counts:
            used.update(spec.split("@")[0] for spec in entry.counts)
    return used


def result_files() -> list[str]:
    """Every committed file holding per-task answers or a promotion decision."""
    found = []
    packed = {path.with_name(path.name.removesuffix(".xz")) for path in RESULTS.rglob("*.json.xz")}
    for path in sorted(set(RESULTS.rglob("*.json")) | packed):
        try:
            data = json.loads(read_packed(path))
        except (OSError, json.JSONDecodeError, lzma.LZMAError):
            continue
        if not isinstance(data, dict):
            continue
        per_task = "task_ids" in data and "modes" in data
        decision = "comparisons" in data or ("validation" in data and "promoted" in data)
        decision = decision or bool(data.get("search_validation")) or "forests" in data
        if per_task or decision or "runs" in data and "table" in data:
            found.append(path.relative_to(RESULTS).as_posix())
    return found


def check_all(entries: list[Entry]) -> tuple[dict[str, str], list[str]]:
    sets = task_sets()
    backings, problems = {}, []
    keys = Counter(entry.key for entry in entries)
    problems += [f"{key}: used {n} times" for key, n in keys.items() if n > 1]
    for entry in entries:
        backings[entry.key], found = check_entry(entry, sets)
        problems += found
    used = referenced(entries)
    for path in result_files():
        if path not in used:
            problems.append(
                f"{path}: a result file no ledger entry uses; hint: add its paired tests to "
                "LEDGER in bench/paired_tests.py (or list it in DUPLICATES / NOT_PAIRED), then "
                "rewrite docs/results/paired-tests.md with --write"
            )
    for copy, original in DUPLICATES.items():
        for figure in figures(read(copy)):
            if answers(fig(copy, figure))[1] != answers(fig(original, figure))[1]:
                problems.append(f"{copy}: {figure} differs from {original}")
    return backings, problems


# ------------------------------------------------------------------ the page


COUNT_ROWS = [  # (label, split, tasks or None for all of the split)
    ("validation, first 40 tasks", "validation", 40),
    ("validation, other 103 tasks", "validation", 103),
    ("validation, all 143 tasks", "validation", 143),
    ("**validation, in all**", "validation", None),
    ("**test, the first 60 tasks**", "test60", None),
    ("**test, the other 137 tasks**", "test137", None),
    ("test, all 197 pooled (each also touches both parts above)", "test197", None),
    ("**train**", "train", None),
]


def count_row(entries: list[Entry], backings: dict[str, str]) -> Counter:
    row: Counter = Counter(tests=len(entries))
    for entry in entries:
        row[ROLES[entry.role]] += 1
        row["recomputed" if backings[entry.key] in TASK_BY_TASK else "not"] += 1
    return row


def counts_table(entries: list[Entry], backings: dict[str, str]) -> str:
    lines = [
        "| split | paired tests | decided | informed a later choice | reported only "
        "| checked task by task against committed files | counts only or no committed file |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, split, tasks in COUNT_ROWS:
        chosen = [x for x in entries if x.split == split and tasks in (None, x.tasks)]
        row = count_row(chosen, backings)
        lines.append(
            f"| {label} | {row['tests']} | {row['decided']} | {row['informed']} | "
            f"{row['reported']} | {row['recomputed']} | {row['not']} |"
        )
    return "\n".join(lines)


def p_text(entry: Entry) -> str:
    better, worse = p_values(entry)
    if entry.gained == entry.lost == 0 and not entry.samples:
        return "-"
    if net_loss(entry):
        return f"worse {worse:.3f}"
    return f"{better:.3f}" if better >= 0.001 else "< 0.001"


def short(path: str) -> str:
    """The third curve's store paths, shortened: rounds/round-N/…/eval/candidate/test/..."""
    return re.sub(r"store/runs/[^/]+/round-\d+(/|$)", r"…\1", path)


def backed_text(entry: Entry, backing: str) -> str:
    if backing == "no committed file":
        return "*(no committed file)*"
    if entry.counts:
        files = sorted({spec.split("@")[0] for spec in entry.counts})
        return "counts only: " + ", ".join(f"`{f}`" for f in files) + " *(tasks not committed)*"
    specs = entry.first + entry.second
    files = sorted({re.split(r"[:#]", spec)[0] for spec in specs} | set(entry.decision))
    return ", ".join(f"`{short(f)}`" for f in files)


def split_tables(entries: list[Entry], backings: dict[str, str]) -> str:
    out = []
    for split, title in SPLITS.items():
        rows = [entry for entry in entries if entry.split == split]
        out += [
            f"### {title}: {len(rows)}",
            "",
            "| # | date | candidate vs reference | tasks | gained / lost | p (exact, one-sided) | "
            "decided / informed | where reported | backed by |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for entry in rows:
            role = f"**{entry.role}**: {entry.outcome}" if entry.role else "-"
            where = entry.where + (f" (note: {entry.note})" if entry.note else "")
            out.append(
                f"| {entry.key} | {entry.date} | {entry.what} | {PART_NAMES[entry.tasks]} | "
                f"+{entry.gained} / -{entry.lost} | {p_text(entry)} | {role} | {where} | "
                f"{backed_text(entry, backings[entry.key])} |"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- paired_tests.py {name} -->", f"<!-- /paired_tests.py {name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"error: no {begin} ... {end} block in the page")
    return pattern.sub(lambda _: f"{begin}\n{body.rstrip()}\n{end}", text)


def blocks(entries: list[Entry], backings: dict[str, str]) -> dict[str, str]:
    return {"counts": counts_table(entries, backings), "tables": split_tables(entries, backings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write",
        type=Path,
        nargs="?",
        const=PAGE,
        help=f"rewrite the generated blocks of this page (default {PAGE.relative_to(REPO)})",
    )
    args = parser.parse_args()
    entries = ledger()
    backings, problems = check_all(entries)
    if problems:
        print("\n".join(f"error: {problem}" for problem in problems), file=sys.stderr)
        raise SystemExit(1)
    print(counts_table(entries, backings))
    if args.write:
        text = args.write.read_text()
        for name, body in blocks(entries, backings).items():
            text = replace_block(text, name, body)
        args.write.write_text(text)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
