"""How often promotion sees a real gain, and how often it promotes when there is none, by
simulation (issue 37 item 3): today's rule (one greedy answer per validation task, exact
one-sided McNemar) against the paired sign-flip test on per-task pass counts of the greedy
answer plus k answers sampled at the search temperature (`promotion.samples`), with the
no-regression guard mode (`promotion.guard_modes`, zero_shot).

    nice -n 19 .venv/bin/python bench/promotion_power.py --json docs/results/promotion-power.json

The model of the tasks, fitted to committed result files where they say something:

- Difficulty. The incumbent's probability p that one answer sampled at the search temperature
  solves a task is Beta(a, b), fitted to the base model's best-of-n curve on the 60 test tasks
  (docs/results/learning-curve/base-test.json: a task counts as solved by best-of-n about when
  one of n samples solves it, so the solved fraction is 1 - E(1 - p)^n, n = 2, 4, 8, 16): many
  tasks near 0, a few in between, fewer near 1. The fit is then shifted on the logit scale to
  the validation split's greedy solve rate (22 of 143, round-0-evaluate/incumbent-validation).
- Effect. The candidate's probability is q = sigmoid(logit p + delta), delta ~ N(mu, sigma)
  on every task ("diffuse") or on 15% of the tasks, 0 elsewhere ("sparse": a few tasks change
  a lot). sigma is set so that the greedy answers lose 0.3 tasks per task gained at +5 points
  (the committed rounds' paired greedy outcomes lost 0 to 0.55 per task gained, middle ~0.3:
  +8/-2, +16/-5, +9/-4 on 143 validation tasks, +9/-1, +6/-0, +21/-7, +16/-8 on 137 test
  tasks; --loss-per-gain); mu so that the mean of q - p is d (the gain in solve rate, points).
- Greedy answers. Each policy's greedy answer solves a task when U < its probability, with one
  uniform U per task for both policies: two close policies' greedy answers differ only where
  their probabilities do (the committed rounds agree on most solved tasks), so their greedy
  discordance is sum |q - p|. The greedy answer is thus taken to solve as often as a sample.
- Samples: k per task and policy, independent, Binomial(k, p) and Binomial(k, q).
- Guard mode (zero_shot): greedy answers only, its own Beta draw shifted to zero_shot's rate
  on the 137 test tasks (25 of 137), no difference between the policies (same churn).

No difference ("false promotion") is measured two ways: exchangeable (each task's pair (p, q)
drawn as above with mean difference 0 and given to the two policies in random order: the
sign-flip test's null exactly, its level must hold) and mean-zero churn (delta ~ N(mu0, sigma)
with mean q - p = 0: tasks gained and lost by a policy that is no better; not exchangeable task
by task, so it checks the test where its assumption is only nearly true).

p-values are exact: the null distribution of the sum of the positive differences (each task's
|difference| counted with probability 1/2) is computed from its generating function by FFT, and
checked against codeq.promotion.sign_flip_p_values (exact integer counting) on some replicates.
Everything is seeded; the JSON holds the fit, the calibration and every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeq.promotion import sign_flip_p_values  # noqa: E402

BON_FILE = REPO / "docs/results/learning-curve/base-test.json"
VALIDATION_FILE = (
    REPO / "docs/results/learning-curve-whole/round-0-evaluate/incumbent-validation.json"
)
ZERO_SHOT_FILE = REPO / "docs/results/learning-curve/replication/test137-base-zero_shot.json"
SPARSE_FRACTION = 0.3
CLIP = 1e-9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=143, help="validation tasks")
    parser.add_argument("--replicates", type=int, default=4000, help="simulated rounds a cell")
    parser.add_argument(
        "--null-replicates",
        type=int,
        default=16000,
        help="simulated rounds a cell with no difference (a rate near the level: SE 0.0017)",
    )
    parser.add_argument("--samples", default="0,2,4,8,16", help="k values (comma-separated)")
    parser.add_argument("--effects", default="3,5,8", help="gains in points (comma-separated)")
    parser.add_argument(
        "--reference-draws",
        type=int,
        default=100_000,
        help="tasks drawn once to calibrate the effect and the solve rates on",
    )
    parser.add_argument("--level", type=float, default=0.05)
    parser.add_argument(
        "--loss-per-gain",
        type=float,
        default=0.3,
        help="greedy tasks lost per task gained at +5 points (the committed rounds: 0 to 0.55)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="the incumbent's greedy solve rate (default: the committed validation split's)",
    )
    parser.add_argument(
        "--reach-guard",
        action="store_true",
        help="also each k with promotion.reach_guard: blocked where the candidate reaches "
        "significantly fewer tasks (any of the greedy + k answers passing; exact McNemar)",
    )
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    return parser.parse_args()


# ----------------------------------------------------------------------------- the fit


def read(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def best_of_n_curve(results: dict[str, Any]) -> dict[int, float]:
    return {int(n): r["solved"] / r["n"] for n, r in results["bon_ablation"].items()}


def none_of_n(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """E (1 - p)^n for p ~ Beta(a, b)."""
    value = np.ones(np.broadcast(a, b).shape)
    for j in range(n):
        value = value * (b + j) / (a + b + j)
    return value


def fit_beta(curve: dict[int, float]) -> tuple[float, float, float]:
    """Beta(a, b) whose 1 - E(1 - p)^n is nearest the best-of-n curve (least squares on a
    log grid); returns a, b and the root mean squared error."""
    a, b = np.meshgrid(np.exp(np.linspace(-4, 2, 601)), np.exp(np.linspace(-2, 6, 801)))
    error = np.zeros(a.shape)
    for n, solved in curve.items():
        error += (1 - none_of_n(a, b, n) - solved) ** 2
    best = np.unravel_index(np.argmin(error), error.shape)
    return float(a[best]), float(b[best]), float(np.sqrt(error[best] / len(curve)))


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, CLIP, 1 - CLIP)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def bisect(function: Any, low: float, high: float, target: float, steps: int = 40) -> float:
    """x in [low, high] with function(x) = target, function increasing."""
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if function(middle) < target else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class Difficulty:
    a: float
    b: float
    shift: float  # added to logit p: moves the mean to the split's solve rate

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return sigmoid(logit(rng.beta(self.a, self.b, shape)) + self.shift)


def difficulty_at(
    a: float, b: float, rate: float, draws: int, rng: np.random.Generator
) -> Difficulty:
    reference = logit(rng.beta(a, b, draws))
    shift = bisect(lambda c: float(sigmoid(reference + c).mean()), -10, 10, rate)
    return Difficulty(a, b, shift)


# ----------------------------------------------------------------------------- the effect


@dataclass(frozen=True)
class EffectModel:
    """delta ~ N(mu, sigma) on a `fraction` of the tasks (0 on the others)."""

    name: str
    fraction: float
    sigma: float

    def mu_for(self, gain: float, reference: Reference) -> float:
        return bisect(lambda mu: reference.gain(self, mu)[0], -20, 20, gain)


@dataclass(frozen=True)
class Reference:
    """Fixed draws on which the effect is calibrated (common random numbers: the calibration
    is a smooth function of mu and sigma)."""

    p: np.ndarray
    logit_p: np.ndarray
    z: np.ndarray
    affected: np.ndarray

    @classmethod
    def draw(cls, difficulty: Difficulty, draws: int, rng: np.random.Generator) -> Reference:
        p = difficulty.draw(rng, (draws,))
        z, affected = rng.standard_normal(draws), rng.random(draws)
        return cls(p=p, logit_p=logit(p), z=z, affected=affected)

    def q(self, model: EffectModel, mu: float) -> np.ndarray:
        affected = self.affected < model.fraction
        q = self.p.copy()
        q[affected] = sigmoid(self.logit_p[affected] + mu + model.sigma * self.z[affected])
        return q

    def gain(self, model: EffectModel, mu: float) -> tuple[float, float, float]:
        """Mean q - p, and the mean gained and lost probability (greedy discordance)."""
        change = self.q(model, mu) - self.p
        return (
            float(change.mean()),
            float(np.clip(change, 0, None).mean()),
            float(np.clip(-change, 0, None).mean()),
        )


def calibrate(
    name: str, fraction: float, gain: float, loss_per_gain: float, reference: Reference
) -> EffectModel | None:
    """sigma at which the greedy answers lose `loss_per_gain` tasks per task gained at `gain`
    (None: no sigma does, e.g. a sparse effect on tasks that rarely solve has few to lose)."""

    def losses(sigma: float) -> float:
        model = EffectModel(name, fraction, sigma)
        _, gained, lost = reference.gain(model, model.mu_for(gain, reference))
        return lost / gained

    sigma = bisect(losses, 1e-3, 20.0, loss_per_gain, steps=30)
    if abs(losses(sigma) - loss_per_gain) > 0.01:
        return None
    return EffectModel(name, fraction, sigma)


# ----------------------------------------------------------------------------- the tests


def sign_flip_fft(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact one-sided p-values (better, worse) of the sign-flip test for each row of integer
    differences: the sum S of the positive parts under random signs has generating function
    prod_i (1 + z^|d_i|) / 2, evaluated at the L-th roots of unity and inverted by an FFT
    (L above the largest S, so nothing wraps round)."""
    rows = differences.shape[0]
    size = np.abs(differences)
    largest = max(int(size.max()), 1)
    counts = np.stack([(size == v).sum(axis=1) for v in range(1, largest + 1)], axis=1)
    reach = (counts * np.arange(1, largest + 1)).sum(axis=1)
    length = 1 << int(reach.max() + 1).bit_length()
    cosines = np.cos(np.pi * np.outer(np.arange(1, largest + 1), np.arange(length)) / length)
    # prod_v cos^m_v as exp(m @ log|cos|) with the sign's parity m @ [cos < 0]: one product
    magnitude = counts @ np.log(np.maximum(np.abs(cosines), 1e-300))
    parity = counts @ (cosines < 0).astype(np.int64)
    angle = np.pi * (np.outer(reach, np.arange(length)) / length + parity)
    transform = np.exp(magnitude + 1j * angle)
    pmf = np.fft.fft(transform, axis=1).real / length
    at_least = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]
    at_most = np.cumsum(pmf, axis=1)
    positive = np.clip(differences, 0, None).sum(axis=1)
    index = np.arange(rows)
    return at_least[index, positive], at_most[index, positive]


def significant(p: np.ndarray, level: float) -> np.ndarray:
    return p < level - 1e-9  # FFT rounding must not turn an exact p = level into p < level


# ----------------------------------------------------------------------------- one condition


@dataclass(frozen=True)
class Condition:
    label: str
    model: EffectModel
    mu: float
    exchangeable: bool


def draw_pair(
    condition: Condition, difficulty: Difficulty, rng: np.random.Generator, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    p = difficulty.draw(rng, shape)
    affected = rng.random(shape) < condition.model.fraction
    delta = np.where(affected, condition.mu + condition.model.sigma * rng.standard_normal(shape), 0)
    q = sigmoid(logit(p) + delta)
    if condition.exchangeable:
        swap = rng.random(shape) < 0.5
        p, q = np.where(swap, q, p), np.where(swap, p, q)
    return p, q


def simulate(
    condition: Condition,
    gate: Difficulty,
    guard: Difficulty,
    guard_null: Condition,
    ks: list[int],
    replicates: int,
    args: argparse.Namespace,
    rng: np.random.Generator,
) -> dict[str, float]:
    """P(promote) under `condition` for today's rule and each k (with the guard)."""
    promoted = {"today": 0, **{f"k={k}": 0 for k in ks}}
    if args.reach_guard:
        promoted |= {f"k={k}, reach guard": 0 for k in ks}
    chunk = 500
    for start in range(0, replicates, chunk):
        rows = min(chunk, replicates - start)
        shape = (rows, args.tasks)
        p, q = draw_pair(condition, gate, rng, shape)
        u = rng.random(shape)
        greedy_q, greedy_p = (u < q).astype(np.int64), (u < p).astype(np.int64)
        passes_q, passes_p = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
        sampled = {}  # k -> each task's passes among k samples (candidate, incumbent)
        for previous, k in zip([0, *ks], ks, strict=False):
            # nested: the first k samples of k' > k are those of k
            passes_q = passes_q + rng.binomial(k - previous, q)
            passes_p = passes_p + rng.binomial(k - previous, p)
            sampled[k] = (passes_q, passes_p)
        # the guard mode: greedy answers, no difference, its own tasks' difficulty
        gp, gq = draw_pair(guard_null, guard, rng, shape)
        gu = rng.random(shape)
        guard_diff = (gu < gq).astype(np.int64) - (gu < gp).astype(np.int64)
        _, guard_worse = sign_flip_fft(guard_diff)
        guard_blocks = significant(guard_worse, args.level)
        better, worse = sign_flip_fft(greedy_q - greedy_p)
        promoted["today"] += int(
            (significant(better, args.level) & ~significant(worse, args.level)).sum()
        )
        for k in ks:
            answers_q, answers_p = greedy_q + sampled[k][0], greedy_p + sampled[k][1]
            better, worse = sign_flip_fft(answers_q - answers_p)
            wins = significant(better, args.level) & ~significant(worse, args.level)
            promoted[f"k={k}"] += int((wins & ~guard_blocks).sum())
            if args.reach_guard:  # a task is reached when any of its k + 1 answers passes
                reached = (answers_q > 0).astype(np.int64) - (answers_p > 0).astype(np.int64)
                _, narrower = sign_flip_fft(reached)
                kept = wins & ~guard_blocks & ~significant(narrower, args.level)
                promoted[f"k={k}, reach guard"] += int(kept.sum())
    return {rule: count / replicates for rule, count in promoted.items()}


def check_against_exact(rng: np.random.Generator) -> float:
    """Largest gap between the FFT p-values and codeq.promotion's exact counting."""
    differences = rng.integers(-9, 10, (12, 143)) * (rng.random((12, 143)) < 0.3)
    better, worse = sign_flip_fft(differences)
    gap = 0.0
    for row, b, w in zip(differences, better, worse, strict=True):
        exact = sign_flip_p_values([int(d) for d in row])
        gap = max(gap, abs(exact[0] - b), abs(exact[1] - w))
    return gap


# ----------------------------------------------------------------------------- the table


def table(
    title: str,
    figures: dict[str, dict[str, float]],
    ks: list[int],
    gains: list[float],
    reach_guard: bool = False,
):
    columns = ["exchangeable", "mean-zero churn", *[f"+{g:g} points" for g in gains]]
    lines = [
        f"\n{title}",
        "| rule | answers per task | false promotion, exchangeable | false promotion, "
        "mean-zero churn | " + " | ".join(f"power at +{g:g} points" for g in gains) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in gains) + " |",
    ]
    rules = [("today", "greedy McNemar, no guard (today)", 1)] + [
        (f"k={k}", f"sign-flip, k = {k}, zero_shot guard", 1 + k) for k in ks
    ]
    if reach_guard:
        rules += [
            (f"k={k}, reach guard", f"sign-flip, k = {k}, zero_shot and reach guards", 1 + k)
            for k in ks
        ]
    for key, label, answers in rules:
        cells = " | ".join(f"{figures[column][key]:.3f}" for column in columns)
        lines.append(f"| {label} | {answers} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    ks = sorted({int(k) for k in args.samples.split(",")})
    gains = [float(g) for g in args.effects.split(",")]
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()

    curve = best_of_n_curve(read(BON_FILE))
    a, b, rmse = fit_beta(curve)
    validation = read(VALIDATION_FILE)["modes"]["full_rewrite"]
    rate = args.rate if args.rate is not None else validation["solved"] / validation["n"]
    zero_shot = read(ZERO_SHOT_FILE)["modes"]["zero_shot"]
    zero_shot_rate = zero_shot["solved"] / zero_shot["n"]
    gate = difficulty_at(a, b, rate, args.reference_draws, rng)
    guard = difficulty_at(a, b, zero_shot_rate, args.reference_draws, rng)
    reference = Reference.draw(gate, args.reference_draws, rng)
    gap = check_against_exact(rng)
    assert gap < 1e-9, f"FFT p-values differ from the exact ones by {gap}"

    calibrated = {
        "diffuse": calibrate("diffuse", 1.0, 0.05, args.loss_per_gain, reference),
        "sparse": calibrate("sparse", SPARSE_FRACTION, 0.05, args.loss_per_gain, reference),
    }
    models = [model for model in calibrated.values() if model is not None]
    if not models or models[0].name != "diffuse":
        raise SystemExit(f"no diffuse effect loses {args.loss_per_gain} tasks per task gained")
    guard_reference = Reference.draw(guard, args.reference_draws, rng)
    guard_null = Condition("guard", models[0], models[0].mu_for(0.0, guard_reference), True)
    out: dict[str, Any] = {
        "command": "nice -n 19 .venv/bin/python bench/promotion_power.py " + " ".join(sys.argv[1:]),
        "tasks": args.tasks,
        "replicates": args.replicates,
        "null_replicates": args.null_replicates,
        "not_calibrated": [name for name, model in calibrated.items() if model is None],
        "level": args.level,
        "loss_per_gain": args.loss_per_gain,
        "seed": args.seed,
        "fit": {
            "file": str(BON_FILE.relative_to(REPO)),
            "best_of_n_solved": curve,
            "beta_a": a,
            "beta_b": b,
            "rmse": rmse,
            "fitted": {n: float(1 - none_of_n(np.array(a), np.array(b), n)) for n in curve},
            "mean_p_test": a / (a + b),
            "validation_rate": rate,
            "validation_logit_shift": gate.shift,
            "zero_shot_rate": zero_shot_rate,
            "zero_shot_logit_shift": guard.shift,
        },
        "fft_vs_exact_max_gap": gap,
        "models": {},
    }
    print(
        f"difficulty: Beta({a:.3f}, {b:.3f}) fits best-of-n {curve} (rmse {rmse:.3f}); "
        f"mean p {a / (a + b):.3f} on test, shifted to {rate:.3f} (validation greedy)"
    )
    for model in models:
        figures: dict[str, dict[str, float]] = {}
        calibration: dict[str, Any] = {"sigma": model.sigma, "fraction": model.fraction}
        effects = {f"+{g:g} points" for g in gains}
        conditions = [
            Condition("exchangeable", model, model.mu_for(0.0, reference), True),
            Condition("mean-zero churn", model, model.mu_for(0.0, reference), False),
            *[
                Condition(f"+{g:g} points", model, model.mu_for(g / 100, reference), False)
                for g in gains
            ],
        ]
        for condition in conditions:
            mean, gained, lost = reference.gain(model, condition.mu)
            calibration[condition.label] = {
                "mu": condition.mu,
                "greedy_gained_tasks": gained * args.tasks,
                "greedy_lost_tasks": lost * args.tasks,
                "mean_gain_points": 100 * mean,
            }
            replicates = args.replicates if condition.label in effects else args.null_replicates
            figures[condition.label] = simulate(
                condition, gate, guard, guard_null, ks, replicates, args, rng
            )
        out["models"][model.name] = {"calibration": calibration, "promotion_rate": figures}
        title = (
            f"{model.name} effect (delta on {model.fraction:.0%} of tasks, sigma "
            f"{model.sigma:.2f}; +5 points = greedy "
            f"+{reference.gain(model, model.mu_for(0.05, reference))[1] * args.tasks:.1f}/"
            f"-{reference.gain(model, model.mu_for(0.05, reference))[2] * args.tasks:.1f} on "
            f"{args.tasks} tasks)"
        )
        print(table(title, figures, ks, gains, args.reach_guard))
    out["seconds"] = round(time.perf_counter() - started, 1)
    for name in out["not_calibrated"]:
        print(f"\n{name} effect: no sigma loses {args.loss_per_gain} tasks per task gained")
    print(
        f"\n{args.replicates} replicates a cell ({args.null_replicates} with no difference), "
        f"{args.tasks} tasks, level {args.level}, loss per gain {args.loss_per_gain}, seed "
        f"{args.seed}; {out['seconds']} s"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
