"""Allocation strategies: hand-written expected tables, and the properties each promises."""

from __future__ import annotations

import pytest

from equeue_core.allocation import allocate

STRATEGIES = ["averagely", "averagely_by_circle", "consistent_hash"]


def table(strategy: str, n_queues: int, n_consumers: int) -> dict[str, list[int]]:
    ids = [f"c{i}" for i in range(n_consumers)]
    return {c: allocate(strategy, c, list(range(n_queues)), ids) for c in ids}


@pytest.mark.parametrize("shape,expected", [
    ((8, 3), {"c0": [0, 1, 2], "c1": [3, 4, 5], "c2": [6, 7]}),
    ((3, 5), {"c0": [0], "c1": [1], "c2": [2], "c3": [], "c4": []}),
    ((16, 4), {"c0": [0, 1, 2, 3], "c1": [4, 5, 6, 7], "c2": [8, 9, 10, 11], "c3": [12, 13, 14, 15]}),
])
def test_averagely_gives_contiguous_blocks_first_consumers_one_more(shape, expected):
    assert table("averagely", *shape) == expected


@pytest.mark.parametrize("shape,expected", [
    ((8, 3), {"c0": [0, 3, 6], "c1": [1, 4, 7], "c2": [2, 5]}),
    ((3, 5), {"c0": [0], "c1": [1], "c2": [2], "c3": [], "c4": []}),
    ((16, 4), {"c0": [0, 4, 8, 12], "c1": [1, 5, 9, 13], "c2": [2, 6, 10, 14], "c3": [3, 7, 11, 15]}),
])
def test_averagely_by_circle_deals_queues_round_the_table(shape, expected):
    assert table("averagely_by_circle", *shape) == expected


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("shape", [(8, 3), (3, 5), (16, 4), (1, 1), (0, 2)])
def test_every_queue_is_taken_by_exactly_one_consumer(strategy, shape):
    t = table(strategy, *shape)
    taken = sorted(q for qs in t.values() for q in qs)
    assert taken == list(range(shape[0]))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_assignment_does_not_depend_on_input_order(strategy):
    queues = [("t", q) for q in range(8)]
    ids = ["b", "c", "a"]
    for me in ids:
        assert allocate(strategy, me, queues, ids) == allocate(strategy, me, list(reversed(queues)), sorted(ids))


def test_consistent_hash_moves_only_the_leavers_queues():
    queues = list(range(64))
    before = {c: set(allocate("consistent_hash", c, queues, ["a", "b", "c", "d"])) for c in "abcd"}
    after = {c: set(allocate("consistent_hash", c, queues, ["a", "b", "d"])) for c in "abd"}
    for c in "abd":
        assert before[c] <= after[c], f"{c} lost queues although it stayed"
    assert set().union(*after.values()) == set(queues)


def test_a_consumer_not_in_the_group_takes_nothing():
    for s in STRATEGIES:
        assert allocate(s, "stranger", [0, 1, 2], ["a", "b"]) == []


def test_unknown_strategy_lists_installed_ones():
    from equeue_core.errors import PluginError

    with pytest.raises(PluginError, match="averagely"):
        allocate("nope", "a", [0], ["a"])
