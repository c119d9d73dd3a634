"""What each committed round's DPO did to its policy, read from the files the curve keeps in git
(docs/results/<curve>/rounds/round-N/): how the held-out pairs' implicit rewards moved from the
first held-out evaluation to the last (DPO's reward is beta x the log-probability ratio to the
reference, so a falling chosen reward is the chosen programs growing less likely: the
"likelihood displacement" that DPO on a model's own samples is known for), and how the
candidate's validation answers differ from the incumbent's in kind (rewrites returned unchanged,
not extracted, passing the visible tests), greedy and sampled. Nothing is computed again; no
model, no sandbox.

    python bench/round_training.py --rounds docs/results/learning-curve-defaults/rounds \
        --markdown docs/results/learning-curve-defaults/round-training.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import curve_rounds  # noqa: E402
from curve_findings import mode_findings  # noqa: E402

from codeq.schemas import Trajectory  # noqa: E402

ANSWERS = {"greedy": "trajectories-full_rewrite", "sampled": "trajectories-full_rewrite-samples"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=Path, required=True, help="a curve's rounds/ folder")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="the curve's budget")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    return parser.parse_args(argv)


def stored(folder: Path, keys: dict[str, Any], suffix: str) -> bytes | None:
    """The committed round's object whose store key ends with `suffix`, checked against the
    sha256 its round.json records (`curve_rounds.committed_content`); None where it has none."""
    matches = [key for key in keys if key.endswith(suffix)]
    return curve_rounds.committed_content(folder, matches[0], keys[matches[0]]) if matches else None


def training(metrics: dict[str, Any]) -> dict[str, Any]:
    """Held-out rewards at the first and last evaluation, and the change in the chosen
    programs' log-probability ratio (nats) between them."""
    evals = metrics.get("eval") or []
    beta = (metrics.get("config") or {}).get("beta") or 0.1
    row: dict[str, Any] = {
        "pairs": (metrics.get("pairs") or {}).get("total"),
        "replayed": metrics.get("replayed") or {},
        "steps": metrics.get("global_steps"),
        "best_step": metrics.get("best_step"),
        "heldout_evaluations": len(evals),
    }
    if evals:
        first, last = evals[0], evals[-1]
        for key in ("rewards/chosen", "rewards/rejected", "rewards/accuracies"):
            row[f"first {key}"] = first.get(f"eval_{key}")
            row[f"last {key}"] = last.get(f"eval_{key}")
        row["chosen_logratio_change"] = (
            last["eval_rewards/chosen"] - first["eval_rewards/chosen"]
        ) / beta
        row["rejected_logratio_change"] = (
            last["eval_rewards/rejected"] - first["eval_rewards/rejected"]
        ) / beta
    return row


def answers(raw: bytes | None, max_new_tokens: int) -> dict[str, Any] | None:
    if raw is None:
        return None
    trees = [Trajectory.model_validate_json(line) for line in raw.decode().splitlines() if line]
    found = mode_findings(trees, max_new_tokens)
    kept = ("tasks", "rewrites", "unchanged", "not_extracted", "without_closing_fence")
    return {key: found[key] for key in kept} | {
        "passing_reward_tests": found["rewrites_passing_reward_tests"] / max(found["rewrites"], 1)
    }


def round_row(number: int, folder: Path, max_new_tokens: int) -> dict[str, Any] | None:
    keys = json.loads((folder / curve_rounds.ROUND_FILE).read_text())["keys"]
    metrics_raw = stored(folder, keys, f"/round-{number}/adapter/metrics.json")
    if metrics_raw is None:
        return None
    row: dict[str, Any] = {"round": number, "training": training(json.loads(metrics_raw))}
    for kind, name in ANSWERS.items():
        for role in ("incumbent", "candidate"):
            trees = stored(folder, keys, f"/round-{number}/eval/{role}/validation/{name}.jsonl")
            found = answers(trees, max_new_tokens)
            if found is not None:
                row.setdefault(kind, {})[role] = found
    row["reach"] = reach(folder, keys, number)
    return row


def reach(folder: Path, keys: dict[str, Any], number: int) -> dict[str, Any] | None:
    """The gate's pass counts and the tasks any answer passes (greedy plus k sampled), the
    candidate against the incumbent on validation, by codeq.promotion's own comparison; None
    for a round evaluated without sampled answers."""
    from codeq.evaluate.results import EvalResults
    from codeq.promotion import compare_modes

    evaluated = {}
    for role in ("candidate", "incumbent"):
        raw = stored(folder, keys, f"/round-{number}/eval/{role}/validation/results.json")
        if raw is None:
            return None
        evaluated[role] = EvalResults.model_validate_json(raw).modes["full_rewrite"]
    sampled = evaluated["candidate"].sampled
    if sampled is None or evaluated["incumbent"].sampled is None:
        return None
    compared = compare_modes(
        "full_rewrite", evaluated["candidate"], evaluated["incumbent"], sampled.samples
    )
    counts = compared.pass_counts
    assert counts is not None and counts.reach is not None
    return {
        "samples": counts.samples,
        "answers": counts.answers,
        "passes": [counts.incumbent_passes, counts.candidate_passes],
        "tasks_better_worse": [counts.tasks_better, counts.tasks_worse],
        "p_better": compared.p_better,
        "reach": counts.reach.model_dump(),
    }


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def signed(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:+.{digits}f}"


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# What each round's DPO did to its policy",
        "",
        f"Generated by `{command}` from the committed rounds; do not edit by hand.",
        "",
        "Held-out pairs (the train stage's 10%): the chosen and rejected programs' log-probability "
        "ratio to the reference, in nats, from the first held-out evaluation to the last, and the "
        "reward accuracy at both. Both ratios falling is likelihood displacement: training "
        "separates the pair by making the rejected program less likely, and the chosen one less "
        "likely too.",
        "",
        "| round | pairs | steps (kept) | chosen ratio change | rejected ratio change "
        "| accuracy first → last |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t = row["training"]
        lines.append(
            f"| {row['round']} | {t['pairs']} | {t['steps']} ({t['best_step']}) "
            f"| {signed(t.get('chosen_logratio_change'))} "
            f"| {signed(t.get('rejected_logratio_change'))} "
            f"| {percent(t.get('first rewards/accuracies'))} → "
            f"{percent(t.get('last rewards/accuracies'))} |"
        )
    lines += [
        "",
        "Validation answers (143 tasks; greedy: one a task, sampled: 8 a task), incumbent → "
        "candidate: answers that are no rewrite (the buggy program returned unchanged, or no "
        "program at all), answers whose code block never closes (cut off at the token budget), "
        "and answers passing the visible tests.",
        "",
        "| round | answers | no rewrite | no closing fence | passing visible tests |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        for kind in ANSWERS:
            pair = row.get(kind) or {}
            if set(pair) != {"incumbent", "candidate"}:
                continue
            before, after = pair["incumbent"], pair["candidate"]
            cells = [
                f"{percent(before[key])} → {percent(after[key])}"
                for key in ("not_extracted", "without_closing_fence", "passing_reward_tests")
            ]
            lines.append(f"| {row['round']} | {kind} | " + " | ".join(cells) + " |")
    reached = [row for row in rows if row.get("reach")]
    if reached:
        lines += [
            "",
            "Reach on validation (rounds evaluated with sampled answers), incumbent → candidate: "
            "the gate's passes among each task's greedy answer and k sampled ones (the "
            "sign-flip test's sums, its p for a gain), and the tasks where at least one of "
            "those answers passes, with the tasks only one policy reaches and the exact "
            "one-sided McNemar p of reaching fewer (promotion.reach_guard; docs/promotion-power.md).",
            "",
            "| round | answers a task | passes | p (more passes) | tasks reached | "
            "reached only by the candidate / the incumbent | p worse (reach) |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in reached:
            r = row["reach"]
            lines.append(
                f"| {row['round']} | {r['samples'] + 1} | {r['passes'][0]} → {r['passes'][1]} "
                f"| {r['p_better']:.3g} | {r['reach']['incumbent']} → {r['reach']['candidate']} "
                f"| +{r['reach']['gained']} / -{r['reach']['lost']} "
                f"| {r['reach']['p_worse']:.3g} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = args.rounds.parent  # curve_rounds names a round's folder from the results'
    rows = [
        row
        for number in curve_rounds.committed_rounds(results)
        if (
            row := round_row(
                number, curve_rounds.round_folder(results, number), args.max_new_tokens
            )
        )
        is not None
    ]
    if not rows:
        raise SystemExit(f"error: no finished round with a trained adapter under {args.rounds}")
    command = "python bench/round_training.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = markdown(rows, command)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
