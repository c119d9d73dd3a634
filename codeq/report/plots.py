"""Plots of the round report, rendered with matplotlib's Agg backend to base64 PNG strings."""

from __future__ import annotations

import base64
import io
from typing import Any

PALETTE = {"base": "#8c8c8c", "adapter": "#1f77b4"}


def _figure_png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _new_axes(width: float = 7.0, height: float = 3.6) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def solve_rate_bars(groups: dict[str, dict[str, dict[str, Any]]], title: str) -> str:
    """Grouped bars with Wilson-interval error bars. groups: series -> label -> rate stats."""
    fig, ax = _new_axes()
    labels = sorted({label for series in groups.values() for label in series})
    width = 0.8 / max(1, len(groups))
    for index, (series, stats) in enumerate(groups.items()):
        xs, ys, lows, highs = [], [], [], []
        for position, label in enumerate(labels):
            if label not in stats:
                continue
            entry = stats[label]
            xs.append(position + (index - (len(groups) - 1) / 2) * width)
            ys.append(entry["solve_rate"])
            # results written before wilson_interval pinned its ends hold bounds ~1e-17 past
            # the rate; matplotlib refuses a negative error bar
            lows.append(max(0.0, entry["solve_rate"] - entry["ci_low"]))
            highs.append(max(0.0, entry["ci_high"] - entry["solve_rate"]))
        ax.bar(
            xs,
            ys,
            width=width,
            yerr=[lows, highs],
            capsize=3,
            label=series,
            color=PALETTE.get(series),
        )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(
        labels, rotation=20 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center"
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("solve rate (hidden tests)")
    ax.set_title(f"{title} (95% Wilson intervals)")
    ax.legend()
    return _figure_png(fig)


def rollout_ablation_plot(series: dict[str, dict[str, dict[str, Any]]]) -> str:
    fig, ax = _new_axes()
    for name, ablation in series.items():
        budgets = sorted(ablation, key=int)
        rates = [ablation[b]["solve_rate"] for b in budgets]
        lows = [ablation[b]["ci_low"] for b in budgets]
        highs = [ablation[b]["ci_high"] for b in budgets]
        xs = [int(b) for b in budgets]
        ax.plot(xs, rates, marker="o", label=name, color=PALETTE.get(name))
        ax.fill_between(xs, lows, highs, alpha=0.15, color=PALETTE.get(name))
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1)
    ax.set_xlabel("MCTS rollouts")
    ax.set_ylabel("solve rate (hidden tests)")
    ax.set_title("MCTS rollout budget ablation")
    ax.legend()
    return _figure_png(fig)


def dpo_curves(metrics: dict[str, Any]) -> str:
    """Reward accuracy and margins per step (train), with held-out accuracy at each evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 3.6))
    steps = metrics.get("steps", [])
    xs = [entry.get("step", i + 1) for i, entry in enumerate(steps)]
    evals = metrics.get("eval", [])
    _plot_dpo_metric(left, xs, steps, evals, "rewards/accuracies", baseline=0.5)
    left.set_ylim(-0.02, 1.02)
    left.set_title("DPO reward accuracy")
    _plot_dpo_metric(right, xs, steps, evals, "rewards/margins", baseline=0.0)
    right.set_title("DPO reward margin (chosen - rejected)")
    return _figure_png(fig)


def _plot_dpo_metric(
    axes: Any,
    xs: list[Any],
    steps: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    metric: str,
    baseline: float,
) -> None:
    """One DPO metric per optimizer step: training, plus held-out evaluations when present."""
    axes.plot(xs, [entry.get(metric) for entry in steps], label="train", marker=".")
    if evals:
        axes.plot(
            [entry.get("step") for entry in evals],
            [entry.get(f"eval_{metric}") for entry in evals],
            label="held-out",
            marker="o",
        )
    axes.axhline(baseline, color="#999", linestyle=":", linewidth=1)
    axes.set_xlabel("optimizer step")
    axes.legend()


def learning_curve_plot(points: list[dict[str, Any]]) -> str:
    """Test-split solve rate of each round's policy, per mode, with Wilson intervals.
    points: [{"label": ..., "modes": {mode: rate stats}}] in round order."""
    fig, ax = _new_axes(width=max(7.0, 1.4 * len(points)))
    modes = sorted({mode for point in points for mode in point["modes"]})
    for offset, mode in enumerate(modes):
        xs, ys, lows, highs = [], [], [], []
        for position, point in enumerate(points):
            stats = point["modes"].get(mode)
            if stats is None:
                continue
            xs.append(position + (offset - (len(modes) - 1) / 2) * 0.08)
            ys.append(stats["solve_rate"])
            lows.append(stats["solve_rate"] - stats["ci_low"])
            highs.append(stats["ci_high"] - stats["solve_rate"])
        ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=mode)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([point["label"] for point in points])
    ax.set_ylim(0, 1)
    ax.set_ylabel("solve rate (test split)")
    ax.set_title("Learning curve: each round's policy on the test split (95% Wilson intervals)")
    ax.legend()
    return _figure_png(fig)
