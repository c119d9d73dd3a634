"""Plots of the round report, rendered with matplotlib's Agg backend to base64 PNG strings."""

from __future__ import annotations

import base64
import io
from typing import Any

PALETTE = {"base": "#8c8c8c", "adapter": "#1f77b4"}
# What every solve rate here is: the returned program scored on the task's visible and hidden
# tests (codeq.evaluate.results.SCORED_ON), the search having seen the visible ones only.
SOLVE_RATE_LABEL = "solve rate (visible + hidden tests)"


def _figure_bytes(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    # no "Software" entry: the same data gives the same file whatever matplotlib wrote it
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _figure_png(fig: Any) -> str:
    return base64.b64encode(_figure_bytes(fig)).decode("ascii")


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
    ax.set_ylabel(SOLVE_RATE_LABEL)
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
    ax.set_ylabel(SOLVE_RATE_LABEL)
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
    """The round report's learning curve (see draw_learning_curve) as a base64 PNG string."""
    fig, ax = _new_axes(width=max(7.0, 1.6 * len(points)), height=4.2)
    draw_learning_curve(ax, points, "Each round's candidate on the test split")
    return _figure_png(fig)


def learning_curve_figure(panels: list[tuple[str, list[dict[str, Any]]]]) -> bytes:
    """Several learning curves, one panel a row, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one panel a row, as wide as the longest curve needs: side by side, a curve of a dozen
    # rounds squeezed its tick labels into each other, and the whole was too wide to read
    width = max(max(4.5, 1.6 * len(points)) for _, points in panels)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(width, 4.6 * len(panels)), sharey=True, squeeze=False
    )
    # one colour a mode across panels, so that best-of-16 reads the same in every row
    colors = mode_colors([point for _, points in panels for point in points])
    for ax, (title, points) in zip(axes[:, 0], panels, strict=True):
        draw_learning_curve(ax, points, title, colors)
    return _figure_bytes(fig)


def mode_colors(points: list[dict[str, Any]]) -> dict[str, str]:
    """Each mode of the points its matplotlib cycle colour, in order of first appearance."""
    modes = dict.fromkeys(mode for point in points for mode in point["modes"])
    return {mode: f"C{index}" for index, mode in enumerate(modes)}


def draw_learning_curve(
    ax: Any, points: list[dict[str, Any]], title: str, colors: dict[str, str] | None = None
) -> None:
    """Test-split solve rate per mode of the policy a run started from and of each round's
    candidate, with 95% Wilson intervals. points, in round order: {"label", "promoted" (None
    for the starting policy, else whether validation promoted the candidate), "validation"
    (None, or the gate mode's {"gained", "lost", "p_better"}, and "answers" a task when the
    sign-flip test on pass counts decided: codeq.promotion.gate_figures), "modes": {mode: rate
    stats}}.
    Filled markers joined by a line are the policies the run went on from (its start and each
    promoted candidate); a hollow marker is a candidate validation kept out. colors: a colour
    per mode (mode_colors), shared by the panels of one figure; by default this panel's own."""
    from matplotlib.lines import Line2D

    colors = colors or mode_colors(points)
    modes = list(dict.fromkeys(mode for point in points for mode in point["modes"]))
    for offset, mode in enumerate(modes):
        color = colors[mode]
        shift = (offset - (len(modes) - 1) / 2) * 0.09
        chain_x, chain_y = [], []
        for position, point in enumerate(points):
            stats = point["modes"].get(mode)
            if stats is None:
                continue
            x, rate = position + shift, stats["solve_rate"]
            kept_out = point.get("promoted") is False
            ax.errorbar(
                [x],
                [rate],
                yerr=[[max(0.0, rate - stats["ci_low"])], [max(0.0, stats["ci_high"] - rate)]],
                marker="o",
                markersize=6,
                capsize=3,
                color=color,
                markerfacecolor="white" if kept_out else color,
                linestyle="none",
            )
            if not kept_out:
                chain_x.append(x)
                chain_y.append(rate)
        ax.plot(chain_x, chain_y, color=color, linewidth=1.2)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([_curve_tick(point) for point in points], fontsize=8)
    top = max((s["ci_high"] for p in points for s in p["modes"].values()), default=0.5)
    ax.set_ylim(0, min(1.0, top + 0.15))
    ax.set_xlim(-0.5, len(points) - 0.5)
    ax.set_ylabel(f"test-split {SOLVE_RATE_LABEL}")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles = [Line2D([], [], color=colors[mode], marker="o", label=mode) for mode in modes]
    handles.append(
        Line2D(
            [],
            [],
            color="#555",
            marker="o",
            markerfacecolor="white",
            linestyle="none",
            label="kept out by validation",
        )
    )
    ax.legend(handles=handles, fontsize=8, loc="best")


def p_text(p: float) -> str:
    """A p-value as the docs write it: '=0.031', '=0.5', '=1', '<0.001'."""
    return "<0.001" if p < 0.001 else "=" + f"{p:.3f}".rstrip("0").rstrip(".")


def _curve_tick(point: dict[str, Any]) -> str:
    """'round 1\npromoted\nval. +16/-5, p=0.013' (the starting policy: its label and 'start')."""
    if point.get("promoted") is None:
        return f"{point['label']}\nstart"
    text = f"{point['label']}\n{'promoted' if point['promoted'] else 'kept out'}"
    validation = point.get("validation")
    if validation:
        text += (
            f"\nval. +{validation['gained']}/-{validation['lost']}, "
            f"p{p_text(validation['p_better'])}"
        )
        if validation.get("answers"):  # decided on pass counts: tasks with more / fewer
            text += f"\n(passes of {validation['answers']} answers)"
    return text
