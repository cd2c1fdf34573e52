"""Which queue of a topic a producer's next `send_async` batch goes to: the one it has sent the
fewest messages to.

Why not round robin batch by batch: with one broker, messages without a routing key gather in
their topic's one open batch, whose queue is chosen when it opens (sticky per batch, as Kafka's
sticky partitioner), and a batch leaves when the one before it is answered, so batches differ in
size by a hundredfold. Round robin gave every queue the same number of batches, not of messages:
1M messages of 1 KiB over 1000 queues left 2 to 1431 in a queue, and at 100 B 2 to 3902
(docs/benchmarks.md, "An even spread over a topic's queues"). A consumer group splits queues, not
messages, so its members got uneven shares of the work.

Here each new batch goes to the queue with the fewest messages from this producer so far, the
longest-waiting first among equals (so batches of one size go round robin, as before). A
batch's size is known once it has left the open batches, which is before the next batch of
its topic opens (a topic has one open batch at a time), so `queue_for_batch` counts the last
batch in and then chooses: no hook on the many paths a batch leaves by.

Guarantees: a queue is chosen only while no queue has fewer messages, so at any time the
queues are within one batch of each other (the largest batch's messages); a queue with none is
chosen before any queue gets a second batch. The producer keeps a topic's spread in its route,
over every refresh that finds the same queues; a route with other queues starts a new one, from
zero. Messages sent outside the open batches (`send`, `send_batch`, the thread lane) take the
same choice and are counted at once, so a topic's queues stay even over every way of sending.
Not thread-safe: the producer calls it under its lock. Costs one heap pop and push per batch
(per message on the thread lane and per `send`, a few hundred ns next to a round trip).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any


class QueueSpread:
    """The queue choice of one topic's batches (see the module docstring)."""

    __slots__ = ("queues", "_sent", "_heap", "_order", "_last")

    def __init__(self, queues: Sequence[int]) -> None:
        self.queues = queues  # the route's queue ids this spread was made for
        self._sent: dict[int, int] = {q: 0 for q in queues}  # messages sent to each queue so far
        self._order = itertools.count()  # ties go to the queue that waited longest
        # (messages sent, order, queue id) of every queue but the open batch's
        self._heap: list[tuple[int, int, int]] = [(0, next(self._order), q) for q in queues]
        self._last: Any = None  # the batch opened last, counted in when the next one opens

    def queue_for_batch(self, batch: Any) -> int:
        """The queue for a batch that is opening now; the batch opened before it (any batch with
        `queue` and `count`) has left the open batches, so its count is final."""
        self._count_last()
        queue = heapq.heappop(self._heap)[2]
        self._last = batch
        return queue

    def queue_for(self, count: int = 1) -> int:
        """The queue for `count` messages sent at once outside the open batches (a message on
        the thread lane, a `send`, a `send_batch`), counted at once."""
        self._count_last()
        _, _, queue = heapq.heappop(self._heap)
        self._put_back(queue, count)
        return queue

    def _count_last(self) -> None:
        last = self._last
        if last is not None:
            self._last = None
            self._put_back(last.queue, last.count)

    def _put_back(self, queue: int, count: int) -> None:
        sent = self._sent[queue] + count
        self._sent[queue] = sent
        heapq.heappush(self._heap, (sent, next(self._order), queue))

    def sent(self) -> dict[int, int]:
        """Messages counted per queue so far (the open batch's not yet)."""
        return dict(self._sent)
