"""The shard of an Indexed Job: which (index, count) pairs are valid and which tasks a shard
gets. Every caller (the collect and evaluate Jobs' environment, `codeq collect --shard-index`,
the collect and evaluate stages) goes through these functions."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypeVar

from codeq.errors import BadInputError, ConfigError

SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"
SHARD_COUNT_ENV = "JOB_COMPLETION_COUNT"
JOB_SHARD_HINT = f"{SHARD_INDEX_ENV} must be below {SHARD_COUNT_ENV}"

Item = TypeVar("Item")


def check_shard(
    index: int,
    count: int,
    *,
    index_name: str = "--shard-index",
    count_name: str = "--shard-count",
    hint: str = "pass --shard-index below --shard-count",
) -> None:
    """Raise BadInputError unless 0 <= index < count (count >= 1); the names are how the
    caller's user spells the two numbers (flags, or the Job's environment variables)."""
    if count < 1 or not 0 <= index < count:
        raise BadInputError(
            f"{index_name}={index} is outside 0..{count - 1} ({count_name}={count})", hint=hint
        )


def check_job_shard(index: int, count: int) -> None:
    """check_shard, worded for an Indexed Job's environment."""
    check_shard(
        index, count, index_name=SHARD_INDEX_ENV, count_name=SHARD_COUNT_ENV, hint=JOB_SHARD_HINT
    )


def shard_from_env(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(index, count) of an Indexed Job; (0, 1) outside one."""
    raw_index = environ.get(SHARD_INDEX_ENV, "0")
    raw_count = environ.get(SHARD_COUNT_ENV, "1")
    try:
        index, count = int(raw_index), int(raw_count)
    except ValueError:
        raise ConfigError(
            f"{SHARD_INDEX_ENV}={raw_index!r} / {SHARD_COUNT_ENV}={raw_count!r} are not integers",
            hint="run the stage as an Indexed Job (completionMode: Indexed)",
        ) from None
    check_job_shard(index, count)
    return index, count


def shard_of(items: Sequence[Item], index: int, count: int) -> list[Item]:
    """Items i with i % count == index (the file's order; every item in exactly one shard)."""
    check_shard(index, count)
    return [item for i, item in enumerate(items) if i % count == index]


def shard_of_groups(items: Sequence[Item], index: int, count: int, size: int) -> list[Item]:
    """Whole groups of `size` consecutive items (by position in `items`), group g to shard
    g % count, in order. A deterministic search takes its tasks in exactly such groups
    (codeq.search.mcts.search_groups), so a shard searches the batches one process would."""
    check_shard(index, count)
    if size < 1:
        raise ValueError(f"group size must be at least 1, got {size}")
    return [item for i, item in enumerate(items) if (i // size) % count == index]
