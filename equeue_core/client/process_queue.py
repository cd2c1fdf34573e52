"""ProcessQueue: the messages of one assigned queue that were pulled and are not finished yet.

The committable offset is the smallest offset still in flight (a slow or failing message holds it
back) or, when nothing is in flight, the next offset to pull, so messages skipped by a tag filter
are committed too. Messages are added in offset order and a dict keeps insertion order, so the
first key is always the smallest in-flight offset.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from equeue_core.client.message import ReceivedMessage
from equeue_core.client.pull_batch import AdaptivePullBatch


class ProcessQueue:
    def __init__(self, topic: str, queue_id: int, next_offset: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.next_offset = next_offset  # the next offset to pull
        self.in_flight: dict[int, ReceivedMessage] = {}
        self.bytes = 0
        self.pending: deque[ReceivedMessage] = deque()  # orderly: pulled, not yet handed out
        self.waiting: deque[list[ReceivedMessage]] = deque()  # concurrent: batches not yet started
        self.running = 0  # concurrent: batches being handled now
        self.dropped = False
        self.locked = False  # orderly: the broker granted this consumer the queue's lock
        self.lock_until = 0.0  # orderly: monotonic time the lock counts as held until, unless renewed
        self.lock_epoch = 0  # orderly: +1 each time the lock is lost; work of an older epoch is void
        self.needs_offset = False  # orderly: after a lost lock, start again from the committed offset
        self.last_committed: int | None = None
        self.parked_at: int | None = None  # stopped at this offset: a corrupt record (consumer._park)
        self.pull_batch: AdaptivePullBatch | None = None  # made by the consumer on first use
        # Set whenever something changes that a waiting loop may care about (messages handled,
        # messages arrived, lock gained, queue dropped): loops wait on it instead of polling.
        self.changed = asyncio.Event()
        # Loops waiting in wait_change now: a handler thread that finishes a batch of this queue
        # wakes the event loop only while someone watches (client/handler_pool.py).
        self.watched = 0

    def wake(self) -> None:
        self.changed.set()

    async def wait_change(self, timeout: float, collect: Callable[[], None] | None = None) -> None:
        """Wait until wake() or timeout; the timeout is only a safety net. `collect` runs once
        this queue counts as watched and before the wait: it takes in what finished before a
        handler thread could see the watch (a change it makes ends the wait at once)."""
        self.changed.clear()
        self.watched += 1
        try:
            if collect is not None:
                collect()
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self.watched -= 1

    def holds_lock(self) -> bool:
        """Orderly: the lock is ours and was renewed recently enough to still trust it."""
        return self.locked and not self.dropped and time.monotonic() < self.lock_until

    def lose_lock(self) -> None:
        """Orderly: the lock is gone (connection lost, expired, taken). Everything pulled under it
        is forgotten: another consumer may handle those messages now, so they are pulled again
        from the committed offset once the lock is back."""
        self.locked = False
        self.lock_epoch += 1
        self.pending.clear()
        self.in_flight.clear()
        self.bytes = 0
        self.needs_offset = True
        self.changed.set()

    def add(self, messages: list[ReceivedMessage]) -> None:
        for m in messages:
            self.in_flight[m.queue_offset] = m
            self.bytes += len(m.body)

    def done(self, message: ReceivedMessage) -> None:
        if self.in_flight.pop(message.queue_offset, None) is not None:
            self.bytes -= len(message.body)
        self.changed.set()

    def done_many(self, messages: list[ReceivedMessage]) -> None:
        pop = self.in_flight.pop
        freed = 0
        for m in messages:
            if pop(m.queue_offset, None) is not None:
                freed += len(m.body)
        self.bytes -= freed
        self.changed.set()

    def committable(self) -> int:
        for offset in self.in_flight:
            return offset
        return self.next_offset

    def span(self) -> int:
        for offset in self.in_flight:
            return self.next_offset - offset
        return 0

    def is_full(self, max_messages: int, max_bytes: int, max_span: int) -> bool:
        """Flow control: stop pulling this queue while any limit is passed."""
        return (len(self.in_flight) >= max_messages or self.bytes >= max_bytes
                or self.span() >= max_span)
