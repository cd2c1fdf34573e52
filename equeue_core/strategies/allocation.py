"""Allocation strategies: which of a group's queues one consumer takes.

Every strategy sorts queues and consumer ids first, so each member of a group computes the same
assignment from the same membership without talking to the others.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Any


def _sorted(consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any]) -> tuple[list, list]:
    qs = sorted(queues)
    ids = sorted(set(consumer_ids))
    if consumer_id not in ids:
        return qs, []
    return qs, ids


def averagely(consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any]) -> list:
    """Contiguous blocks: the first n % c consumers take one queue more."""
    qs, ids = _sorted(consumer_id, queues, consumer_ids)
    if not ids or not qs:
        return []
    i = ids.index(consumer_id)
    n, c = len(qs), len(ids)
    mod = n % c
    if n <= c:
        size = 1
    elif mod > 0 and i < mod:
        size = n // c + 1
    else:
        size = n // c
    start = i * size if (mod > 0 and i < mod) else i * size + mod
    return qs[start:start + max(0, min(size, n - start))]


def averagely_by_circle(consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any]) -> list:
    """Queue j goes to consumer j % c, dealing queues round the table."""
    qs, ids = _sorted(consumer_id, queues, consumer_ids)
    if not ids:
        return []
    i = ids.index(consumer_id)
    return [q for j, q in enumerate(qs) if j % len(ids) == i]


VIRTUAL_NODES = 10  # per consumer, RocketMQ's default


def ring_hash(key: str) -> int:
    """RocketMQ's ring hash (ConsistentHashRouter's MD5Hash): the first 4 bytes of the MD5
    digest of the key's UTF-8 bytes, read big-endian as an unsigned 32-bit number."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


def queue_key(queue: Any) -> str:
    """The string a queue is hashed by: `<topic>@<queue id>` for a (topic, queue id) pair, str()
    of anything else. RocketMQ hashes Java's MessageQueue.toString() ("MessageQueue [topic=...,
    brokerName=..., queueId=...]"); ours has no broker name (docs/decisions.md)."""
    if isinstance(queue, tuple) and len(queue) == 2:
        return f"{queue[0]}@{queue[1]}"
    return str(queue)


def consistent_hash(consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any],
                    virtual_nodes: int = VIRTUAL_NODES) -> list:
    """RocketMQ's AllocateMessageQueueConsistentHash: each consumer puts `virtual_nodes` points
    on a ring at ring_hash("<consumer id>-<i>"), i = 0..virtual_nodes-1, consumers in sorted
    order (a later point replaces an earlier one with the same hash); a queue goes to the first
    point at or after ring_hash(queue_key(queue)), wrapping round to the smallest. When a
    consumer leaves, only its queues move."""
    qs, ids = _sorted(consumer_id, queues, consumer_ids)
    if not ids:
        return []
    ring: dict[int, str] = {}
    for cid in ids:
        for v in range(virtual_nodes):
            ring[ring_hash(f"{cid}-{v}")] = str(cid)
    points = sorted(ring)
    me = str(consumer_id)
    out = []
    for q in qs:
        i = bisect.bisect_left(points, ring_hash(queue_key(q)))
        if ring[points[i % len(points)]] == me:
            out.append(q)
    return out
