"""Search over full-program rewrites: MCTS, best-of-N, multi-turn best-of-N, single greedy
rewrites; `collect`."""

from codeq.search.collect import collect
from codeq.search.mcts import Policy, Scorer, run_search, sandbox_scorer, search
from codeq.search.tree import (
    SEARCH_MODES,
    SearchSettings,
    TieBreak,
    Tree,
    critique_tie_break,
    ucb1,
)

__all__ = [
    "SEARCH_MODES",
    "Policy",
    "Scorer",
    "SearchSettings",
    "TieBreak",
    "Tree",
    "collect",
    "critique_tie_break",
    "run_search",
    "sandbox_scorer",
    "search",
    "ucb1",
]
