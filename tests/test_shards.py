"""The one shard rule: every task in exactly one shard, and a bad (index, count) refused in the
words of whoever passed it (flags, or an Indexed Job's environment)."""

import pytest

from codeq.errors import BadInputError, ConfigError
from codeq.shards import shard_from_env, shard_of, shard_of_groups


def test_every_item_lands_in_exactly_one_shard_in_file_order():
    items = list(range(11))
    shards = [shard_of(items, index, 3) for index in range(3)]
    assert sorted(item for shard in shards for item in shard) == items
    assert shards[1] == [1, 4, 7, 10]


def test_group_shards_keep_the_search_groups_whole():
    from codeq.search.mcts import search_groups

    items = list(range(11))
    shards = [shard_of_groups(items, index, 3, 2) for index in range(3)]
    assert shards == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10]]
    # each shard's own groups are groups of the whole list: the batches one process searches
    whole = search_groups(items, 2)
    assert sorted(g for shard in shards for g in search_groups(shard, 2)) == sorted(whole)
    assert shard_of_groups(items[:3], 1, 2, 4) == []  # one group: the second shard gets none


@pytest.mark.parametrize(("index", "count"), [(3, 2), (-1, 2), (0, 0)])
def test_an_index_outside_the_count_is_refused_with_the_flags(index, count):
    with pytest.raises(BadInputError, match=rf"--shard-index={index} is outside"):
        shard_of([1, 2, 3], index, count)


def test_the_job_environment_is_parsed_and_checked():
    assert shard_from_env({}) == (0, 1)
    assert shard_from_env({"JOB_COMPLETION_INDEX": "1", "JOB_COMPLETION_COUNT": "2"}) == (1, 2)
    with pytest.raises(BadInputError, match="JOB_COMPLETION_INDEX=2 is outside 0..1"):
        shard_from_env({"JOB_COMPLETION_INDEX": "2", "JOB_COMPLETION_COUNT": "2"})
    with pytest.raises(ConfigError, match="not integers"):
        shard_from_env({"JOB_COMPLETION_INDEX": "x"})
