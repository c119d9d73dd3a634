"""Render the round report from the stage outputs: pair statistics, DPO metrics and evaluation
results (adapter, and the base model on the same tasks when given)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codeq.errors import BadInputError, CorruptInputError, MissingInputError
from codeq.report import advice, plots
from codeq.schemas import write_json

TEMPLATES = Path(__file__).resolve().parent / "templates"
RATE_KEYS = ("n", "solved", "solve_rate", "ci_low", "ci_high")


def read_json_input(path: str | Path | None, what: str) -> dict[str, Any] | None:
    """A stage's JSON output (a file, or a folder holding the stage's usual file name)."""
    if path is None:
        return None
    candidate = Path(path)
    if candidate.is_dir():
        candidate = candidate / {
            "evaluate": "results.json",
            "train": "metrics.json",
            "verifier": "verifier.json",
        }.get(what, "stats.json")
    if not candidate.is_file():
        raise MissingInputError(
            f"{what} input {candidate} does not exist", hint=f"run `codeq {what}` first"
        )
    try:
        data = json.loads(candidate.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CorruptInputError(f"{candidate} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CorruptInputError(f"{candidate} must hold a JSON object")
    return data


def _rates(stats: dict[str, Any]) -> dict[str, Any]:
    return {key: stats[key] for key in RATE_KEYS if key in stats}


def compare_on_same_tasks(base: dict[str, Any], adapter: dict[str, Any]) -> dict[str, Any]:
    """Per mode: base vs adapter solve rates on the task ids both evaluated, and the tasks that
    flipped either way (the paired view that a difference of two intervals hides)."""
    shared = sorted(set(base.get("task_ids", [])) & set(adapter.get("task_ids", [])))
    comparison: dict[str, Any] = {"shared_tasks": len(shared), "modes": {}}
    for mode in sorted(set(base.get("modes", {})) & set(adapter.get("modes", {}))):
        base_tasks = base["modes"][mode].get("per_task", {})
        adapter_tasks = adapter["modes"][mode].get("per_task", {})
        ids = [task for task in shared if task in base_tasks and task in adapter_tasks]
        gained = [task for task in ids if adapter_tasks[task] and not base_tasks[task]]
        lost = [task for task in ids if base_tasks[task] and not adapter_tasks[task]]
        comparison["modes"][mode] = {
            "n": len(ids),
            "base_solved": sum(bool(base_tasks[task]) for task in ids),
            "adapter_solved": sum(bool(adapter_tasks[task]) for task in ids),
            "gained": gained,
            "lost": lost,
        }
    return comparison


def build_summary(
    results: dict[str, Any] | None,
    base_results: dict[str, Any] | None,
    train_metrics: dict[str, Any] | None,
    pair_stats: dict[str, Any] | None,
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if pair_stats is not None:
        summary["pairs"] = {
            key: pair_stats.get(key)
            for key in (
                "pairs",
                "trajectories",
                "tasks_with_pairs",
                "by_level",
                "by_category",
                "dropped",
                "critique_auc",
                "q_ai",
            )
        }
        summary["pairs"]["alpha"] = (pair_stats.get("config") or {}).get("alpha")
    if train_metrics is not None and train_metrics.get("trained") is False:
        summary["train_skipped"] = train_metrics.get("reason", "no adapter was trained")
    elif train_metrics is not None:
        summary["train"] = {
            key: train_metrics.get(key)
            for key in (
                "base_model",
                "precision",
                "pairs",
                "global_steps",
                "train_loss",
                "heldout_reward_accuracy",
                "heldout_reward_accuracy_final",
                "best_step",
                "tokens",
                "replayed",
            )
        }
    evaluations = (("evaluation", results), ("base_evaluation", base_results))
    if results is None:  # no new adapter this round: the incumbent's results are the evaluation
        evaluations = (("evaluation", base_results), ("base_evaluation", None))
    for name, data in evaluations:
        if data is None:
            continue
        summary[name] = {
            "model": data.get("model"),
            "adapter": data.get("adapter"),
            "primary_mode": data.get("primary_mode"),
            "tasks": len(data.get("task_ids", [])),
            "modes": {mode: _rates(stats) for mode, stats in data.get("modes", {}).items()},
            "mcts_rollout_ablation": {
                budget: _rates(stats)
                for budget, stats in data.get("mcts_rollout_ablation", {}).items()
            },
            "any_node_passed": (
                {"label": data["any_node_passed"].get("label"), **_rates(data["any_node_passed"])}
                if data.get("any_node_passed")
                else None
            ),
            "selection": _selections(data.get("modes", {})),
        }
    if results is not None and base_results is not None:
        summary["comparison"] = compare_on_same_tasks(base_results, results)
    return summary


def _selections(modes: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per search mode: tasks with a rewrite passing the visible tests, tasks some rewrite
    solves (an oracle's choice), and those of them the returned answer lost."""
    return {
        mode: {
            "visible_passing": stats["selection"]["visible_passing"],
            "solvable": len(stats["selection"]["solvable"]),
            "lost": len(stats["selection"]["lost"]),
        }
        for mode, stats in modes.items()
        if stats.get("selection")
    }


def verifier_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The report's view of eval/verifier.json: what chose among tied answers, and the learned
    verifier's AUC on the validation rewrites (the self-critique's beside it)."""
    validation = record.get("validation") or {}
    within = validation.get("within_task") or {}  # absent in records before it was measured
    info = record.get("verifier") or {}
    return {
        "tie_break": record.get("tie_break"),
        "tie_break_asked": record.get("tie_break_asked"),
        "missing": record.get("missing"),
        "agreement_probes": record.get("agreement_probes"),
        "agreement_ranking": record.get("agreement_ranking"),  # absent before 2026-12-04
        "id": (info.get("adapter_sha256") or "")[:12] or None,
        "heldout_auc": info.get("heldout_auc"),
        "programs": info.get("programs") or {},
        "validation_auc": validation.get("auc"),
        "validation_programs": validation.get("programs"),
        "validation_passing": validation.get("passing"),
        "within_task": {
            "auc": within.get("auc"),
            "pairs": within.get("pairs", 0),
            "tasks": within.get("tasks", 0),
        },
        "critique_auc": validation.get("critique_auc"),
        "critiqued_programs": validation.get("critiqued_programs"),
    }


def _plots(
    results: dict[str, Any] | None,
    base_results: dict[str, Any] | None,
    train_metrics: dict[str, Any] | None,
) -> list[dict[str, str]]:
    series = {
        name: data
        for name, data in (("base", base_results), ("adapter", results))
        if data is not None
    }
    figures: list[dict[str, str]] = []
    if series:
        by_mode = {name: data.get("modes", {}) for name, data in series.items()}
        figures.append(
            {
                "title": "Solve rate by mode",
                "png": plots.solve_rate_bars(by_mode, "Solve rate by mode"),
            }
        )
        for key, label in (("by_category", "category"), ("by_level", "level")):
            grouped = {
                name: data["modes"][data["primary_mode"]].get(key, {})
                for name, data in series.items()
                if data.get("primary_mode") in data.get("modes", {})
            }
            if any(grouped.values()):
                title = f"Solve rate by {label} (primary mode)"
                figures.append({"title": title, "png": plots.solve_rate_bars(grouped, title)})
        ablations = {
            name: data["mcts_rollout_ablation"]
            for name, data in series.items()
            if data.get("mcts_rollout_ablation")
        }
        if ablations:
            figures.append(
                {"title": "MCTS rollout ablation", "png": plots.rollout_ablation_plot(ablations)}
            )
    if train_metrics is not None and train_metrics.get("steps"):
        figures.append(
            {"title": "DPO reward accuracy and margins", "png": plots.dpo_curves(train_metrics)}
        )
    return figures


def counts_text(counts: dict[str, Any] | None) -> str:
    """{'easy': 3, 'hard': 1} as 'easy 3, hard 1' (never a Python repr in the report)."""
    if not counts:
        return "none"
    return ", ".join(f"{key} {value}" for key, value in counts.items())


def names_text(names: list[str] | None) -> str:
    """Task ids as a comma-separated list ('none' when empty)."""
    return ", ".join(names) if names else "none"


def seconds_text(value: float | None) -> str:
    if value is None:
        return "–"
    minutes, seconds = divmod(float(value), 60)
    return f"{int(minutes)}m {seconds:04.1f}s" if minutes else f"{seconds:.1f}s"


def _render_template(name: str, context: dict[str, Any]) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    environment = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["pct"] = lambda value: "–" if value is None else f"{100 * value:.1f}%"
    environment.filters["num"] = lambda value, digits=3: (
        "–" if value is None else f"{value:.{digits}f}"
    )
    environment.filters["counts"] = counts_text
    environment.filters["names"] = names_text
    environment.filters["seconds"] = seconds_text
    return environment.get_template(name).render(**context)


def render_report(
    out_dir: str | Path,
    *,
    results: str | Path | dict[str, Any] | None = None,
    base_results: str | Path | dict[str, Any] | None = None,
    train_metrics: str | Path | dict[str, Any] | None = None,
    pair_stats: str | Path | dict[str, Any] | None = None,
    verifier: str | Path | dict[str, Any] | None = None,
    decision: Any = None,
    learning_curve: list[dict[str, Any]] | None = None,
    examples: list[dict[str, Any]] | None = None,
    stages: list[dict[str, Any]] | None = None,
    title: str = "CodeQ round report",
) -> Path:
    """Write out_dir/report.json, report.md and index.html (plots embedded); return index.html.

    Each input is a stage's JSON output (path, folder or already-loaded dict); any may be absent,
    but not all of them. `verifier` is the evaluation's eval/verifier.json (the learned
    verifier's validation AUC, what chose tied answers). `examples` are fixes the model made
    (codeq.report.examples); `stages` one row per stage of the round: its name, wall seconds and config fingerprint;
    `learning_curve` the run's policies on the test split (codeq.report.plots.draw_learning_curve),
    drawn when it holds more than one round's candidate."""
    loaded = {
        "eval": results if isinstance(results, dict) else read_json_input(results, "evaluate"),
        "base": base_results
        if isinstance(base_results, dict)
        else read_json_input(base_results, "evaluate"),
        "train": train_metrics
        if isinstance(train_metrics, dict)
        else read_json_input(train_metrics, "train"),
        "pairs": pair_stats
        if isinstance(pair_stats, dict)
        else read_json_input(pair_stats, "pairs"),
    }
    if all(value is None for value in loaded.values()):
        raise BadInputError(
            "nothing to report", hint="pass at least one of the eval, train or pairs outputs"
        )
    summary = build_summary(loaded["eval"], loaded["base"], loaded["train"], loaded["pairs"])
    if verifier is not None:
        record = verifier if isinstance(verifier, dict) else read_json_input(verifier, "verifier")
        summary["verifier"] = verifier_summary(record or {})
    if decision is not None:  # a codeq.promotion.PromotionDecision
        summary["promotion"] = decision.model_dump(mode="json")
    if learning_curve:
        summary["learning_curve"] = learning_curve
    if examples:
        summary["examples"] = examples
    if stages:
        summary["stages"] = stages
    summary["next_steps"] = advice.what_next(summary)
    summary["warnings"] = advice.warnings_here(summary)
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    write_json(out_path / "report.json", summary)
    curve_modes = list(
        dict.fromkeys(mode for point in learning_curve or [] for mode in point["modes"])
    )
    context = {"title": title, "summary": summary, "curve_modes": curve_modes}
    (out_path / "report.md").write_text(_render_template("report.md.j2", context), encoding="utf-8")
    figures = _plots(loaded["eval"], loaded["base"], loaded["train"])
    if sum(point.get("promoted") is not None for point in learning_curve or []) > 1:
        figures.insert(
            0,
            {
                "title": "Learning curve across rounds",
                "png": plots.learning_curve_plot(learning_curve or []),
            },
        )
    html = _render_template("index.html.j2", {**context, "figures": figures})
    index = out_path / "index.html"
    index.write_text(html, encoding="utf-8")
    return index
