"""The front page of docs/results.md, recomputed from the committed result files alone (no store,
no model): the headline table of the learning curves (each policy in each single-pass mode,
solved of n with its 95% Wilson interval, paired against the policy it was meant to replace),
MCTS against best-of-N at equal programs, the single pass on the test tasks the curves never
scored, the third curve's promoted policies searching on those tasks (once their search modes'
test run has finished), and the figure (test-split solve rate per round for each mode,
promotions marked).

    .venv/bin/python bench/curve_figure.py                                   # the tables
    .venv/bin/python bench/curve_figure.py --png docs/results/learning-curves.png

Every paired comparison is the exact one-sided test the promotion uses (codeq.promotion), on
the same tasks: McNemar on greedy answers, or, for a round decided with promotion.samples, the
sign-flip test on each task's passing answers; validation figures are read from each round's
round-N-evaluate/ files (per task) where the curve committed them, else from round-N.json
(the decision's gained and lost task ids).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.evaluate.results import EvalResults, ModeResult  # noqa: E402
from codeq.evaluate.stats import wilson_interval  # noqa: E402
from codeq.promotion import ModeComparison, compare_modes, gate_figures  # noqa: E402
from codeq.schemas import Lineage  # noqa: E402

RESULTS = REPO / "docs" / "results"
CURVES = {
    "learning-curve": "First curve: promotion decided on 40 validation tasks",
    "learning-curve-whole": "Second curve: promotion decided on all 143 validation tasks",
}
TEST_MODES = ("full_rewrite", "zero_shot")
# the figure's series: the single-pass modes of every policy, and the search modes where measured
FIGURE_MODES = {
    "full_rewrite": ("modes", "full_rewrite"),
    "zero_shot": ("modes", "zero_shot"),
    "MCTS, 8 rollouts": ("mcts_rollout_ablation", "8"),
    "best-of-16": ("bon_ablation", "16"),
}


def figure_of(results: EvalResults, where: tuple[str, str]) -> ModeResult | None:
    part, key = where
    return getattr(results, part).get(key)


def rate(solved: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(solved, n)
    return {"solved": solved, "n": n, "solve_rate": solved / n, "ci_low": low, "ci_high": high}


def mode_rate(result: ModeResult) -> dict[str, Any]:
    return rate(result.solved, result.n)


def round_files(folder: Path) -> list[dict[str, Any]]:
    numbered = {
        int(match.group(1)): path
        for path in folder.glob("round-*.json")
        if (match := re.fullmatch(r"round-(\d+)", path.stem))
    }
    return [json.loads(numbered[number].read_text()) for number in sorted(numbered)]


def validation_of(folder: Path, entry: dict[str, Any]) -> tuple[ModeComparison, str]:
    """The round's gate comparison on validation and the file(s) it was read from."""
    evaluate = folder / f"round-{entry['round']}-evaluate"
    files = [evaluate / f"{role}-validation.json" for role in ("candidate", "incumbent")]
    if all(path.is_file() for path in files):
        candidate, incumbent = (EvalResults.load(path) for path in files)
        mode = entry["validation"][0]["mode"]
        paired = compare_modes(mode, candidate.modes[mode], incumbent.modes[mode])
        return paired, f"{evaluate.name}/*-validation.json"
    return ModeComparison.model_validate(entry["validation"][0]), f"round-{entry['round']}.json"


def base_row(results: EvalResults | None, validation: dict[str, Any] | None) -> dict[str, Any]:
    """A curve's first row: the policy it started from, paired against nothing."""
    return {
        "name": "base",
        "label": "base model",
        "round": None,
        "promoted": None,
        "incumbent": None,
        "validation": validation,
        "validation_vs": None,
        "validation_source": None,
        "results": results,
        "test_vs": {},
    }


def load_curve(folder: Path) -> list[dict[str, Any]]:
    """One row per policy, in round order: the base model, then each round's candidate (the
    policy a round promoted, or the candidate validation kept out), with its validation
    decision and its test-split figures paired against the round's incumbent."""
    base = EvalResults.load(folder / "base-test.json")
    loaded = {"base": base}
    rounds = round_files(folder)
    first = validation_of(folder, rounds[0])[0] if rounds else None
    rows = [base_row(base, None if first is None else rate(first.incumbent_solved, first.tasks))]
    for entry in rounds:
        name = entry["test_policy"] or entry["test_candidate"]
        results = EvalResults.load(folder / f"{name}-test.json")
        wanted = Lineage.model_validate(entry["incumbent"]).id
        incumbent = named_policy(loaded, wanted)
        loaded[name] = results
        paired, source = validation_of(folder, entry)
        rows.append(
            {
                "name": name,
                "label": f"round {entry['round']}",
                "round": entry["round"],
                "promoted": bool(entry["promoted"]),
                "incumbent": incumbent,
                "validation": rate(paired.candidate_solved, paired.tasks),
                "validation_vs": paired,
                "validation_source": source,
                "results": results,
                "test_vs": {
                    mode: compare_modes(mode, results.modes[mode], loaded[incumbent].modes[mode])
                    for mode in TEST_MODES
                },
            }
        )
    return rows


DEFAULTS_CURVE = "learning-curve-defaults"
DEFAULTS_TITLE = "Third curve: today's defaults, rounds in git (test: the spent first 60)"
MEASUREMENT_TITLE = "Third curve's test measurement: the other 137 test tasks"


def round_eval(folder: Path, number: int, role: str, split: str) -> EvalResults:
    """A committed round's evaluation (rounds/round-N/store/, as its evaluate stage wrote it,
    xz-compressed where that paid)."""
    from curve_rounds import read_packed

    (path,) = (folder / "rounds" / f"round-{number}" / "store" / "runs").glob(
        f"*/round-{number}/eval/{role}/{split}/results.json*"
    )
    return EvalResults.model_validate_json(read_packed(path.with_name("results.json")))


def load_defaults_curve(folder: Path) -> list[dict[str, Any]]:
    """The third curve in load_curve's rows, from the rounds it committed to git: each round's
    evaluate stage scored its candidate and its incumbent (the policy promoted so far) on the
    validation split and on the first 60 test tasks, full_rewrite only."""
    rounds = round_files(folder)
    base = round_eval(folder, rounds[0]["round"], "incumbent", "test") if rounds else None
    loaded: dict[str, EvalResults] = {} if base is None else {"base": base}
    rows: list[dict[str, Any]] = []
    for entry in rounds:
        number = entry["round"]
        validation = {
            role: round_eval(folder, number, role, "validation")
            for role in ("candidate", "incumbent")
        }
        decided = ModeComparison.model_validate(entry["validation"][0])
        samples = decided.pass_counts.samples if decided.pass_counts else 0
        paired = compare_modes(  # the test that decided: greedy McNemar, or sign-flip on passes
            decided.mode,
            validation["candidate"].modes[decided.mode],
            validation["incumbent"].modes[decided.mode],
            samples,
        )
        if not rows:
            rows.append(base_row(base, rate(paired.incumbent_solved, paired.tasks)))
        test = round_eval(folder, number, "candidate", "test")
        wanted = Lineage.model_validate(entry["incumbent"]).id
        incumbent = named_policy(loaded, wanted)
        name = f"round-{number}"
        loaded[name] = test
        rows.append(
            {
                "name": name,
                "label": f"round {number}",
                "round": number,
                "promoted": bool(entry["promoted"]),
                "incumbent": incumbent,
                "validation": rate(paired.candidate_solved, paired.tasks),
                "validation_vs": paired,
                "validation_source": "rounds/round-N/store/**/eval/*/validation/results.json",
                "results": test,
                "test_vs": {  # round 8's prepare built other test tasks: no pairing then
                    m: compare_modes(m, test.modes[m], loaded[incumbent].modes[m])
                    for m in TEST_MODES
                    if m in test.modes and set(test.task_ids) == set(loaded[incumbent].task_ids)
                },
            }
        )
    return rows


def load_test_measurement(folder: Path, curve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The third curve's test measurement (`--test-after-chain`): the rows load_defaults_curve
    built from `folder` (`curve`: the validation decisions), with each policy's figures on the
    137 other test tasks (the file each round-N.json names, test_policy or test_candidate, and
    base-test.json) in place of the first 60, each mode paired against the policy the round was
    meant to replace. Policies not yet measured are left out, and a mode only one of the two
    has is not paired."""
    names = {e["round"]: e["test_policy"] or e["test_candidate"] for e in round_files(folder)}
    measured: dict[str, EvalResults] = {}
    rows = []
    for row in curve:
        name = "base" if row["round"] is None else names[row["round"]]
        path = folder / f"{name}-test.json"
        if not path.is_file():
            continue
        results = EvalResults.load(path)
        measured[row["name"]] = results
        against = measured.get(row["incumbent"])
        test_vs = {
            mode: compare_modes(mode, results.modes[mode], against.modes[mode])
            for mode in TEST_MODES
            if against is not None and mode in results.modes and mode in against.modes
        }
        rows.append({**row, "file": path.name, "results": results, "test_vs": test_vs})
    return rows


SEARCH_MODES = "search-modes"
SEARCH_TEST_TITLE = (
    "Third curve's policies searching: the same 137 test tasks, run once after the chain"
)


def search_labels(record: dict[str, Any]) -> dict[str, str]:
    """The search modes' test run's searches, named with the sizes its record says it ran."""
    search = record["search"]
    return {
        "bon": f"best-of-{search['bon_samples']}",
        "mt_bon": f"multi-turn best-of-{search['mt_bon_samples']}, {search['mt_bon_turns']} turns",
        "mcts": f"MCTS, {search['rollouts']} rollouts",
    }


def load_search_test_run(folder: Path, measurement: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The search modes' test run (bench/search_modes.py --test-run: `folder`/<policy>-test.json
    and the results file it names) of each policy the third curve went on from (the base model
    and each promoted round), in `measurement`'s order (load_test_measurement's rows, whose
    single pass it stands beside), each search paired against the same search of the policy
    the round was meant to replace. A policy whose run has not written its record (the record
    comes when all three searches have finished) is left out."""
    searched: dict[str, EvalResults] = {}
    rows = []
    for row in measurement:
        path = folder / f"{row['name']}-test.json"
        if row["promoted"] is False or not path.is_file():
            continue
        record = json.loads(path.read_text())
        results = EvalResults.load(path.with_name(record["results"]))
        if set(results.task_ids) != set(row["results"].task_ids):
            raise ValueError(
                f"{path.name} searched other tasks than {row['file']}: the search modes and "
                "the single pass are paired only on the same test tasks"
            )
        searched[row["name"]] = results
        against = searched.get(row["incumbent"])
        labels = search_labels(record)
        search_vs = {
            mode: compare_modes(mode, results.modes[mode], against.modes[mode])
            for mode in labels
            if against is not None and mode in against.modes
        }
        rows.append(
            {
                **row,
                "searched": results,
                "search_vs": search_vs,
                "search_labels": labels,
            }
        )
    return rows


def curve_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as codeq.report.plots.draw_learning_curve takes them."""
    points = []
    for row in rows:
        paired = row["validation_vs"]
        modes = {}
        for label, where in FIGURE_MODES.items():
            result = figure_of(row["results"], where)
            if result is not None:
                modes[label] = mode_rate(result)
        points.append(
            {
                "label": "base" if row["round"] is None else row["label"],
                "promoted": row["promoted"],
                "validation": None if paired is None else gate_figures(paired),
                "modes": modes,
            }
        )
    return points


def rate_text(figure: dict[str, Any]) -> str:
    return (
        f"{figure['solved']} / {figure['n']} ({100 * figure['solve_rate']:.0f}%, "
        f"{100 * figure['ci_low']:.0f}%–{100 * figure['ci_high']:.0f}%)"
    )


def p_text(p: float) -> str:
    """0.03125 -> '0.031', 0.5 -> '0.5', 1.0 -> '1', 0.0004 -> '< 0.001'."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}".rstrip("0").rstrip(".")


def p_clause(p: float, label: str = "p") -> str:
    """'p = 0.031', or 'p < 0.001' (never 'p = < 0.001')."""
    text = p_text(p)
    return f"{label} {text}" if text.startswith("<") else f"{label} = {text}"


def named_policy(loaded: dict[str, EvalResults], lineage_id: str) -> str:
    """The name under which `loaded` holds the results of the policy with this lineage id."""
    return next(
        name
        for name, results in loaded.items()
        if results.policy is not None and results.policy.id == lineage_id
    )


def paired_text(paired: ModeComparison | None, against: str | None) -> str:
    """'+5 / -0 vs base, p = 0.031' (p for a gain; for a net loss, p worse: that of a loss)."""
    if paired is None:
        return ""
    gained, lost = len(paired.gained), len(paired.lost)
    counts = paired.pass_counts
    if counts is not None:  # decided on pass counts: say those and the sign-flip p
        better = counts.candidate_passes >= counts.incumbent_passes
        p = p_clause(paired.p_better) if better else p_clause(paired.p_worse, "p worse")
        return (
            f"; +{gained} / -{lost} vs {against}; {counts.samples + 1} answers a task: "
            f"{counts.candidate_passes} against {counts.incumbent_passes} of {counts.answers} "
            f"pass, more on {counts.tasks_better} tasks, fewer on {counts.tasks_worse}, "
            f"sign-flip {p}"
        )
    p = p_clause(paired.p_better) if gained >= lost else p_clause(paired.p_worse, "p worse")
    return f"; +{gained} / -{lost} vs {against}, {p}"


def short_names(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each row's policy as a table names it when pairing against it: 'base', 'round 3'."""
    return {row["name"]: "base" if row["round"] is None else row["label"] for row in rows}


def curve_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| policy | validation, full_rewrite (decides) | test, full_rewrite | test, zero_shot |",
        "|---|---|---|---|",
    ]
    labels = short_names(rows)
    for row in rows:
        decision = (
            ""
            if row["promoted"] is None
            else (": **promoted**" if row["promoted"] else ": kept out")
        )
        against = labels.get(row["incumbent"])
        cells = [
            "–"
            if row["validation"] is None
            else rate_text(row["validation"]) + paired_text(row["validation_vs"], against)
        ]
        for mode in TEST_MODES:
            result = row["results"].modes.get(mode)
            cells.append(
                "–"
                if result is None
                else rate_text(mode_rate(result)) + paired_text(row["test_vs"].get(mode), against)
            )
        lines.append(f"| {row['label']}{decision} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def search_test_table(rows: list[dict[str, Any]], names: dict[str, str]) -> str:
    """Each searched policy's single pass (full_rewrite, from its test measurement) and its
    searches on the same tasks: solved of n with its interval, the programs a search wrote a
    task, each paired against the same mode of the policy the round was meant to replace.
    `names` (short_names of the whole measurement) names that policy even where its own
    search run is not in `rows` yet: the single pass is paired with it all the same."""
    labels = rows[0]["search_labels"]
    lines = [
        "| policy | single pass, full_rewrite | " + " | ".join(labels.values()) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for row in rows:
        against = names.get(row["incumbent"])
        single = row["results"].modes["full_rewrite"]
        cells = [
            rate_text(mode_rate(single)) + paired_text(row["test_vs"].get("full_rewrite"), against)
        ]
        for mode in labels:
            result = row["searched"].modes[mode]
            cells.append(
                f"{rate_text(mode_rate(result))}, {result.programs:.1f} programs a task"
                + paired_text(row["search_vs"].get(mode), against)
            )
        decision = "" if row["promoted"] is None else ": **promoted**"
        lines.append(f"| {row['label']}{decision} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measurement_points(
    measurement: list[dict[str, Any]], searched: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The figure's panel of the 137 test tasks: every measured policy's single pass
    (full_rewrite; zero_shot sends the same request under the plain prompt, so it would draw
    the same points again) and, for the policies searched there, each search."""
    by_name = {row["name"]: row for row in searched}
    points = []
    for point, row in zip(curve_points(measurement), measurement, strict=True):
        modes = {"full_rewrite": point["modes"]["full_rewrite"]}
        found = by_name.get(row["name"])
        if found is not None:
            for mode, label in found["search_labels"].items():
                modes[label] = mode_rate(found["searched"].modes[mode])
        points.append({**point, "modes": modes})
    return points


def search_rows(results_dir: Path) -> list[tuple[str, ModeComparison, float]]:
    """MCTS with 8 rollouts against best-of-16 (the most programs 8 rollouts of K = 2 rewrites
    can write), paired on the same 60 test tasks: (who, comparison, MCTS programs a task)."""
    curve = results_dir / "learning-curve"
    sources = [
        ("base model, the curves' search", curve / "base-test.json", curve / "base-test.json"),
        ("round 0's policy, the curves' search", curve / "round-0-test.json", None),
        (
            "base model, today's search defaults",
            results_dir / "refine" / "test-mcts.json",
            results_dir / "refine" / "test-bon16.json",
        ),
    ]
    rows = []
    for label, mcts_file, bon_file in sources:
        mcts = EvalResults.load(mcts_file)
        bon = EvalResults.load(bon_file or mcts_file)
        eight, sixteen = mcts.mcts_rollout_ablation["8"], bon.bon_ablation["16"]
        rows.append((label, compare_modes("mcts@8 vs bon@16", eight, sixteen), eight.programs))
    return rows


def search_table(rows: list[tuple[str, ModeComparison, float]]) -> str:
    lines = [
        "| policy and search | MCTS, 8 rollouts | best-of-16 | MCTS gained / lost | "
        "p (MCTS better) | p (MCTS worse) |",
        "|---|---|---|---|---|---|",
    ]
    for label, paired, programs in rows:
        lines.append(
            f"| {label} | {rate_text(rate(paired.candidate_solved, paired.tasks))}, "
            f"{programs:.1f} programs a task | "
            f"{rate_text(rate(paired.incumbent_solved, paired.tasks))} | "
            f"+{len(paired.gained)} / -{len(paired.lost)} | {p_text(paired.p_better)} | "
            f"{p_text(paired.p_worse)} |"
        )
    return "\n".join(lines)


REPLICATION = [  # (label, file stem, the policy it is paired against)
    ("base model", "base", None),
    ("round 0 (promoted)", "round0", "base"),
    ("round 1's candidate (kept out)", "round1-candidate", "round0"),
    ("round 2's candidate (kept out)", "round2-candidate", "round0"),
]


def replication_rows(results_dir: Path) -> list[tuple[str, dict[str, Any], ModeComparison | None]]:
    """The first curve's policies, full_rewrite, on the 137 test tasks the curve never scored
    (planned before they ran), each against the policy it was meant to replace."""
    folder = results_dir / "learning-curve" / "replication"
    loaded = {
        stem: EvalResults.load(folder / f"test137-{stem}-full_rewrite.json").modes["full_rewrite"]
        for _, stem, _ in REPLICATION
    }
    return [
        (
            label,
            mode_rate(loaded[stem]),
            None
            if against is None
            else compare_modes("full_rewrite", loaded[stem], loaded[against]),
        )
        for label, stem, against in REPLICATION
    ]


def replication_table(rows: list[tuple[str, dict[str, Any], ModeComparison | None]]) -> str:
    names = {"base": "base", "round0": "round 0"}
    lines = ["| policy | full_rewrite, 137 other test tasks |", "|---|---|"]
    for (label, figure, paired), (_, _, against) in zip(rows, REPLICATION, strict=True):
        named = names.get(against) if against is not None else None
        lines.append(f"| {label} | {rate_text(figure)}{paired_text(paired, named)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="docs/results")
    parser.add_argument("--png", type=Path, help="write the figure here (PNG)")
    args = parser.parse_args(argv)
    panels = []
    for name, title in CURVES.items():
        rows = load_curve(args.results / name)
        panels.append((title, curve_points(rows)))
        sources = sorted({row["validation_source"] for row in rows if row["validation_source"]})
        print(f"## {title} (docs/results/{name}/)\n\n{curve_table(rows)}\n")
        print(f"Validation read from: {', '.join(sources)}.\n")
    rows = load_defaults_curve(args.results / DEFAULTS_CURVE)
    panels.append((DEFAULTS_TITLE, curve_points(rows)))
    print(f"## {DEFAULTS_TITLE} (docs/results/{DEFAULTS_CURVE}/)\n\n{curve_table(rows)}\n")
    measurement = load_test_measurement(args.results / DEFAULTS_CURVE, rows)
    if measurement:
        print(f"## {MEASUREMENT_TITLE} (docs/results/{DEFAULTS_CURVE}/*-test.json)\n")
        print(curve_table(measurement) + "\n")
        searched = load_search_test_run(args.results / SEARCH_MODES, measurement)
        if searched:
            print(f"## {SEARCH_TEST_TITLE} (docs/results/{SEARCH_MODES}/*-test.json)\n")
            print(search_test_table(searched, short_names(measurement)) + "\n")
        panels.append((MEASUREMENT_TITLE, measurement_points(measurement, searched)))
    print("## MCTS against best-of-N at equal programs (test, 60 tasks)\n")
    print(search_table(search_rows(args.results)) + "\n")
    print("## The first curve's single pass on the other 137 test tasks\n")
    print(replication_table(replication_rows(args.results)))
    if args.png:
        from codeq.report.plots import learning_curve_figure

        args.png.write_bytes(learning_curve_figure(panels))
        print(f"\nwrote {args.png}")


if __name__ == "__main__":
    main()
