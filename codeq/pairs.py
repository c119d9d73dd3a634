"""Preference pairs from search trees: sibling rewrites whose blended values clearly differ.

A pair's prompt is exactly the chat prompt that produced both siblings, and chosen/rejected are the
model's own raw completions, so DPO trains on what the policy actually generated.

Blended value: Q = alpha * Q_mcts + (1 - alpha) * Q_ai (Q_ai missing -> Q_mcts alone).
A pair is emitted when |Q_a - Q_b| > theta, after dropping siblings whose prompt evaluation never
gives (a refinement of a program that passes every visible test), degenerate pairs (the two
extracted programs are the same), duplicates, pairs of two invalid rewrites, and pairs beyond the
per-task cap (the largest value gaps are kept).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig, PairsConfig
from codeq.errors import BadInputError, CorruptInputError, VerifierMissingError
from codeq.policy.prompts import asks_past_passing_examples
from codeq.schemas import Lineage, Node, Pair, Trajectory, read_jsonl, write_json, write_jsonl

log = logging.getLogger(__name__)

DROP_REASONS = (
    "small_gap",
    "unseen_prompt",
    "degenerate",
    "duplicate",
    "both_invalid",
    "chosen_invalid",
    "per_task_cap",
)

_WHITESPACE = re.compile(r"\s+")


def normalize_whitespace(text: str) -> str:
    """Collapse every whitespace run to one space and strip the ends."""
    return _WHITESPACE.sub(" ", text).strip()


def same_code(first: str, second: str) -> bool:
    """The same program up to formatting and comments: equal syntax trees (equal text once
    whitespace is normalized when either does not parse)."""
    try:
        return ast.dump(ast.parse(first)) == ast.dump(ast.parse(second))
    except (SyntaxError, ValueError):
        return normalize_whitespace(first) == normalize_whitespace(second)


def blended_value(node: Node, alpha: float) -> float:
    """Q = alpha * Q_mcts + (1 - alpha) * Q_ai; without a critique score, Q_mcts alone."""
    if node.q_ai is None:
        return node.q_mcts
    return alpha * node.q_mcts + (1.0 - alpha) * node.q_ai


@dataclass
class _Candidate:
    pair: Pair
    gap: float


def sibling_groups(trajectory: Trajectory) -> list[list[Node]]:
    """Nodes sharing a parent and the exact prompt that produced them (root excluded)."""
    groups: dict[tuple[int, str], list[Node]] = defaultdict(list)
    for node in trajectory.nodes:
        if node.parent is None:
            continue
        prompt_key = json.dumps([m.model_dump() for m in node.prompt], sort_keys=True)
        groups[(node.parent, prompt_key)].append(node)
    return [nodes for nodes in groups.values() if len(nodes) >= 2]


def seen_at_evaluation(siblings: Sequence[Node]) -> bool:
    """False for siblings refining a program that passes every visible test: a collection
    rewarded by hidden tests too asks that, evaluation (rewarded by visible tests) never does,
    so DPO would learn from prompts the policy is never given."""
    return not asks_past_passing_examples(siblings[0].prompt)


def _pair_key(pair: Pair) -> tuple[str, str, str]:
    prompt = json.dumps([m.model_dump() for m in pair.prompt], sort_keys=True)
    return prompt, normalize_whitespace(pair.chosen), normalize_whitespace(pair.rejected)


def _candidates_of_group(
    trajectory: Trajectory, siblings: Sequence[Node], config: PairsConfig, dropped: Counter[str]
) -> list[_Candidate]:
    candidates: list[_Candidate] = []
    for i, first in enumerate(siblings):
        for second in siblings[i + 1 :]:
            q_first, q_second = (
                blended_value(first, config.alpha),
                blended_value(second, config.alpha),
            )
            gap = abs(q_first - q_second)
            if gap <= config.min_value_gap:
                dropped["small_gap"] += 1
                continue
            chosen, rejected = (first, second) if q_first > q_second else (second, first)
            if not chosen.valid and not rejected.valid:
                dropped["both_invalid"] += 1
                continue
            if not chosen.valid:
                dropped["chosen_invalid"] += 1
                continue
            if same_code(chosen.program, rejected.program):
                dropped["degenerate"] += 1  # the same program in other words teaches nothing
                continue
            pair = Pair(
                task_id=trajectory.task_id,
                slug=trajectory.slug,
                level=trajectory.level,
                category=trajectory.category,
                prompt=list(chosen.prompt),
                chosen=chosen.completion,
                rejected=rejected.completion,
                q_chosen=max(q_first, q_second),
                q_rejected=min(q_first, q_second),
                policy=trajectory.policy,
            )
            candidates.append(_Candidate(pair, gap))
    return candidates


def pairs_of_trajectory(
    trajectory: Trajectory,
    config: PairsConfig,
    seen: set[tuple[str, str, str]],
    dropped: Counter[str],
) -> list[Pair]:
    """Pairs of one task: largest value gaps first, duplicates removed, capped per task."""
    candidates: list[_Candidate] = []
    for siblings in sibling_groups(trajectory):
        if not seen_at_evaluation(siblings):
            dropped["unseen_prompt"] += len(siblings) * (len(siblings) - 1) // 2
            continue
        candidates.extend(_candidates_of_group(trajectory, siblings, config, dropped))
    candidates.sort(key=lambda candidate: candidate.gap, reverse=True)
    kept: list[Pair] = []
    for candidate in candidates:
        key = _pair_key(candidate.pair)
        if key in seen:
            dropped["duplicate"] += 1
            continue
        if len(kept) >= config.max_pairs_per_task:
            dropped["per_task_cap"] += 1
            continue
        seen.add(key)
        kept.append(candidate.pair)
    return kept


def build_pairs(
    trajectories: Iterable[Trajectory], config: PairsConfig
) -> tuple[list[Pair], dict[str, Any]]:
    """All pairs of all trajectories plus statistics (count, by level/category, drops by reason)."""
    seen: set[tuple[str, str, str]] = set()
    dropped: Counter[str] = Counter({reason: 0 for reason in DROP_REASONS})
    pairs: list[Pair] = []
    n_trajectories = 0
    tasks_with_pairs = 0
    for trajectory in trajectories:
        n_trajectories += 1
        task_pairs = pairs_of_trajectory(trajectory, config, seen, dropped)
        tasks_with_pairs += bool(task_pairs)
        pairs.extend(task_pairs)
    return pairs, pair_statistics(pairs, n_trajectories, tasks_with_pairs, dropped, config)


def pair_statistics(
    pairs: Sequence[Pair],
    n_trajectories: int,
    tasks_with_pairs: int,
    dropped: Counter[str],
    config: PairsConfig,
) -> dict[str, Any]:
    gaps = [pair.q_chosen - pair.q_rejected for pair in pairs]
    return {
        "pairs": len(pairs),
        "trajectories": n_trajectories,
        "tasks_with_pairs": tasks_with_pairs,
        "by_level": dict(Counter(pair.level for pair in pairs)),
        "by_category": dict(Counter(pair.category for pair in pairs)),
        "dropped": {reason: dropped[reason] for reason in DROP_REASONS},
        "mean_value_gap": sum(gaps) / len(gaps) if gaps else None,
        "config": config.model_dump(),
    }


# Below this the critique ranks passing rewrites above failing ones barely better than a coin
# (0.5): blending it into the values (alpha < 1) mostly adds noise to which siblings pair up.
CRITIQUE_SIGNAL_AUC = 0.6


@dataclass(frozen=True)
class CritiqueSignal:
    """How well the self-critique tells rewrites apart: the chance that a rewrite passing its
    reward tests scored higher than a failing one (ties count half; 0.5 is no signal)."""

    auc: float | None  # None without both a passing and a failing critiqued rewrite
    passing: int
    failing: int

    @property
    def carries_signal(self) -> bool | None:
        return None if self.auc is None else self.auc >= CRITIQUE_SIGNAL_AUC

    def describe(self) -> str:
        if self.auc is None:
            return f"critique AUC unknown ({self.passing} passing, {self.failing} failing)"
        return f"critique AUC {self.auc:.2f} over {self.passing} passing, {self.failing} failing"


def critique_signal(trajectories: Iterable[Trajectory]) -> CritiqueSignal:
    """The critique's rank AUC over every critiqued, tested rewrite of `trajectories`."""
    passing: list[float] = []
    failing: list[float] = []
    for trajectory in trajectories:
        for node in trajectory.nodes[1:]:
            if node.q_ai is None or node.verdict is None:
                continue
            (passing if node.verdict.passed else failing).append(node.q_ai)
    if not passing or not failing:
        return CritiqueSignal(None, len(passing), len(failing))
    failing.sort()
    wins = 0.0
    for score in passing:  # failing scores below `score` win, equal ones count half
        below = bisect_left(failing, score)
        wins += below + 0.5 * (bisect_right(failing, score) - below)
    return CritiqueSignal(wins / (len(passing) * len(failing)), len(passing), len(failing))


def read_trajectories(paths: Sequence[Path]) -> list[Trajectory]:
    """Trajectories from JSONL files, or from every *.jsonl under given folders (shards)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(path.rglob("*.jsonl")))
        else:
            files.append(path)
    if not files:
        raise BadInputError(
            f"no trajectory files in {', '.join(str(p) for p in paths)}",
            hint="run `codeq collect` first and pass its output file or folder",
        )
    trajectories: list[Trajectory] = []
    for file in files:
        trajectories.extend(read_jsonl(file, Trajectory))
    if not trajectories:
        raise BadInputError(
            f"no trajectories in {', '.join(str(f) for f in files)} (the files are empty)",
            hint="`codeq collect` writes one line per searched task: check that it finished and "
            "searched at least one task",
        )
    return trajectories


def common_policy(trajectories: Sequence[Trajectory]) -> Lineage | None:
    """The one policy that searched every trajectory (None when they do not record it).
    Pairs from two policies would give DPO a reference that wrote only some of them."""
    lineages = {t.policy.id: t.policy for t in trajectories if t.policy is not None}
    if len(lineages) > 1:
        raise CorruptInputError(
            f"the trajectories come from {len(lineages)} different policies "
            f"({', '.join(sorted(lineages))})",
            hint="build pairs from the trajectories of one round's collect stage",
        )
    return next(iter(lineages.values()), None)


# Scores of some rewrites of one trajectory, one per node, in [0, 1]: a learned verifier's
# probability that each passes all its task's tests (Q_ai when pairs.q_ai is 'verifier').
RewriteScorer = Callable[[Trajectory, Sequence[Node]], list[float]]


def with_q_ai(trajectory: Trajectory, scorer: RewriteScorer) -> Trajectory:
    """A copy of `trajectory` whose valid rewrites carry `scorer`'s scores as Q_ai in place of
    the self-critique's (invalid ones keep none, so their value is Q_mcts alone)."""
    rewrites = [node for node in trajectory.nodes[1:] if node.valid]
    scores = dict(zip((node.id for node in rewrites), scorer(trajectory, rewrites), strict=True))
    nodes = [
        node.model_copy(update={"q_ai": scores[node.id]}) if node.id in scores else node
        for node in trajectory.nodes
    ]
    return trajectory.model_copy(update={"nodes": nodes})


def make_pairs(
    trajectory_paths: Sequence[Path],
    out_dir: Path,
    config: CodeQConfig,
    *,
    q_ai: RewriteScorer | None = None,
) -> dict[str, Any]:
    """The pairs stage: read trajectories, write out_dir/pairs.jsonl and out_dir/stats.json.
    `q_ai` (a learned verifier) gives Q_ai in place of the self-critique; pairs.q_ai
    'verifier' without it is refused unless verifier.fallback is 'critique'. stats.json
    records which scored (q_ai) and the critique's AUC either way."""
    asked = config.pairs.q_ai
    if asked == "verifier" and q_ai is None and config.verifier.fallback != "critique":
        raise VerifierMissingError(
            "pairs.q_ai is 'verifier', but no verifier was given to score the rewrites",
            hint="build pairs in a round whose verifier stage trained one (verifier.enabled), "
            "or set pairs.q_ai=critique (or verifier.fallback=critique)",
        )
    trajectories = read_trajectories(trajectory_paths)
    policy = common_policy(trajectories)
    signal = critique_signal(trajectories)
    if q_ai is not None:
        trajectories = [with_q_ai(trajectory, q_ai) for trajectory in trajectories]
    elif asked == "verifier":
        log.warning("pairs.q_ai is 'verifier' but there is none: the self-critique gives Q_ai")
    pairs, stats = build_pairs(trajectories, config.pairs)
    stats["policy"] = policy.model_dump() if policy is not None else None
    if asked == "verifier" or q_ai is not None:  # (stats of critique-only runs are unchanged)
        stats["q_ai"] = "verifier" if q_ai is not None else "critique"
        stats["q_ai_asked"] = asked
    stats["critique_auc"] = signal.auc
    if q_ai is None and config.pairs.alpha < 1.0 and signal.carries_signal is False:
        log.warning(
            "%s: the critique barely tells passing rewrites from failing ones, so blending it "
            "into the values (pairs.alpha=%g) mostly adds noise; consider pairs.alpha=1.0",
            signal.describe(),
            config.pairs.alpha,
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / "pairs.jsonl", pairs)
    write_json(out_dir / "stats.json", stats)
    log.info(
        "%d pairs from %d trajectories (dropped: %s)",
        stats["pairs"],
        stats["trajectories"],
        describe_dropped(stats["dropped"]),
    )
    return stats


def describe_dropped(dropped: dict[str, int]) -> str:
    """'3 small_gap, 1 duplicate' (reasons that dropped nothing left out), or 'none'."""
    return ", ".join(f"{n} {reason}" for reason, n in dropped.items() if n) or "none"
