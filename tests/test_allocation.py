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


def test_consistent_hash_matches_rocketmqs_ring():
    """Values computed from RocketMQ's AllocateMessageQueueConsistentHash (ConsistentHashRouter
    with MD5Hash, 10 virtual nodes), re-derivable with nothing but hashlib:

        h(key) = int.from_bytes(md5(key.encode("utf-8")).digest()[:4], "big")
        ring   = {h(f"{cid}-{i}"): cid for cid in sorted(ids) for i in range(10)}
        owner(queue) = ring[first point >= h(queue key)], or ring[min point] if none is

    A (topic, id) queue's key is f"{topic}@{id}" (ours; Java hashes MessageQueue.toString()).
    Some values: h("c0-0") = 2316876094 (md5 8a18b93e...), h("c1-0") = 3886541579 (e7a7eb0b...),
    h("c2-0") = 830676049 (31831c51...), h("orders@0") = 2387797702 (8e52e6c6...); the highest
    point of c0..c2 is 4293005705 (c0), the lowest 198527331 (c2).
    """
    from equeue_core.strategies.allocation import queue_key, ring_hash

    assert [ring_hash(k) for k in ("c0-0", "c1-0", "c2-0", "orders@0")] == \
        [2316876094, 3886541579, 830676049, 2387797702]
    ids = ["c2", "c0", "c1"]
    queues = [("orders", q) for q in range(8)]
    assert queue_key(queues[0]) == "orders@0"
    got = {c: [q for _, q in allocate("consistent_hash", c, queues, ids)] for c in ids}
    # e.g. orders@1: h = 670789057, first point at or after it is h("c2-?") = 830676049 -> c2
    assert got == {"c0": [0, 2, 3, 5], "c1": [6, 7], "c2": [1, 4]}
    # c1 leaves: only its queues move, each to the next point clockwise
    got = {c: [q for _, q in allocate("consistent_hash", c, queues, ["c0", "c2"])] for c in ("c0", "c2")}
    assert got == {"c0": [0, 2, 3, 5, 7], "c2": [1, 4, 6]}
    # past the highest point the ring wraps to the lowest: h("orders@4324") = 4294888597 -> c2
    assert allocate("consistent_hash", "c2", [("orders", 4324)], ids) == [("orders", 4324)]
    # "at or after": a queue whose key hashes exactly onto a point goes to that point's owner
    # (h("c1-4") = 3912933846 is c1's point; the next point after it is c2's)
    assert allocate("consistent_hash", "c1", ["c1-4", "c2-9"], ids) == ["c1-4"]
    assert allocate("consistent_hash", "c2", ["c1-4", "c2-9"], ids) == ["c2-9"]
