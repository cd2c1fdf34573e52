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


VIRTUAL_NODES = 10


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:8], "big")


def consistent_hash(consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any],
                    virtual_nodes: int = VIRTUAL_NODES) -> list:
    """A ring of `virtual_nodes` MD5 points per consumer; each queue goes to the next point
    clockwise, so when a consumer leaves only its queues move."""
    qs, ids = _sorted(consumer_id, queues, consumer_ids)
    if not ids:
        return []
    ring = sorted((_hash(f"{cid}-{v}"), str(cid)) for cid in ids for v in range(virtual_nodes))
    points = [p for p, _ in ring]
    me = str(consumer_id)
    out = []
    for q in qs:
        idx = bisect.bisect_right(points, _hash(str(q))) % len(ring)
        if ring[idx][1] == me:
            out.append(q)
    return out
