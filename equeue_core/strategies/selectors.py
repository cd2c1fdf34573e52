"""Queue selectors: which queue of a topic a producer sends a message to."""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Sequence


class RoundRobin:
    """Spreads messages evenly; the default when no routing key is given."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def select(self, queue_ids: Sequence[int], routing_key: str | None) -> int:
        return queue_ids[next(self._counter) % len(queue_ids)]


class Hash:
    """crc32 of the routing key modulo the queue count: one key, one queue, so per-key order.
    (crc32 is unsigned, so no negative-modulo surprise; a key without routing falls back to 0.)"""

    def select(self, queue_ids: Sequence[int], routing_key: str | None) -> int:
        key = (routing_key or "").encode()
        return queue_ids[zlib.crc32(key) % len(queue_ids)]


class Random:
    def __init__(self) -> None:
        self._rng = random.Random()

    def select(self, queue_ids: Sequence[int], routing_key: str | None) -> int:
        return queue_ids[self._rng.randrange(len(queue_ids))]
