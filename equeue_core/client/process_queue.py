"""ProcessQueue: the messages of one assigned queue that were pulled and are not finished yet.

The committable offset is the smallest offset still in flight (a slow or failing message holds it
back) or, when nothing is in flight, the next offset to pull, so messages skipped by a tag filter
are committed too.

Two kinds of in-flight entries: whole pulled batches (client/pulled_batch.py; a blocking handler's
usual path), tracked per batch with a cursor (records before it are finished), and single
messages (`in_flight`, offset -> message: the orderly and async-handler paths, and a batch's failed
messages while they are retried or sent back). Messages are added in offset order, so the first
key of `in_flight` is its smallest offset; a failed message of a later batch that finished first
(parallel_per_queue > 1) breaks that order, and then the smallest is searched for.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from equeue_core.client.message import ReceivedMessage
from equeue_core.client.pull_batch import AdaptivePullBatch
from equeue_core.client.pulled_batch import PulledBatch


def _time_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ProcessQueue:
    def __init__(self, topic: str, queue_id: int, next_offset: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.next_offset = next_offset  # the next offset to pull
        self.in_flight: dict[int, ReceivedMessage] = {}
        self._in_order = True  # in_flight's first key is its smallest offset
        self.batches: deque[PulledBatch] = deque()  # pulled batches not finished yet, in pull order
        self.batched = 0  # records of `batches` not finished yet
        self.bytes = 0  # message bodies in in_flight plus the bytes of unfinished batches
        self.pending: deque[ReceivedMessage] = deque()  # orderly: pulled, not yet handed out
        self.waiting: deque[list[ReceivedMessage] | PulledBatch] = deque()  # concurrent: batches not yet started
        self.running = 0  # concurrent: batches being handled now
        self.dropped = False
        self.locked = False  # orderly: the broker granted this consumer the queue's lock
        self.lock_until = 0.0  # orderly: monotonic time the lock counts as held until, unless renewed
        self.lock_epoch = 0  # orderly: +1 each time the lock is lost; work of an older epoch is void
        self.needs_offset = False  # orderly: after a lost lock, start again from the committed offset
        self.last_committed: int | None = None
        self.parked_at: int | None = None  # stopped at this offset: a corrupt record (consumer._park)
        self.pull_batch: AdaptivePullBatch | None = None  # made by the consumer on first use
        self.behind = False  # the broker said more is stored past next_offset (last pull or start point)
        # Loops waiting in wait_change now, each on a future of its own. wake() ends every wait:
        # something changed that a waiting loop may care about (messages handled, messages
        # arrived, lock gained, queue dropped), so loops wait instead of polling.
        self._waiters: list[asyncio.Future[None]] = []
        # Loops waiting in wait_change, plus one while a when_idle callback waits: a handler thread
        # that finishes a batch of this queue wakes the event loop only while someone watches
        # (client/handler_pool.py).
        self.watched = 0
        self._on_idle: Callable[[], None] | None = None  # when_idle's callback, while it waits

    def wake(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_change(self, timeout: float, collect: Callable[[], None] | None = None) -> None:
        """Wait until wake() or timeout; the timeout is only a safety net. `collect` runs once
        this queue counts as watched and before the wait: it takes in what finished before a
        handler thread could see the watch (a change it makes ends the wait at once).

        A future and a loop timer, not asyncio.wait_for over Event.wait (a task of its own per
        wait): a consumer taking on 1000 queues waits here once or more per queue
        (docs/benchmarks.md, "Queue count, fifth pass")."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        self.watched += 1
        timer = None
        try:
            if collect is not None:
                collect()
            if not waiter.done():
                timer = loop.call_later(timeout, _time_up, waiter)
                await waiter
        finally:
            self.watched -= 1
            if timer is not None:
                timer.cancel()
            if not waiter.done():
                waiter.cancel()
            if self._waiters:  # timed out or cancelled: still listed (a wake() empties the list)
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass

    def when_idle(self, callback: Callable[[], None] | None) -> None:
        """Run `callback` once nothing of this queue is in flight: now if nothing is, else on the
        loop thread from the call that finishes the last message (finish_batch, done, done_many).
        A later call replaces a callback still waiting; `when_idle(None)` cancels it. While one
        waits, the queue counts as watched, so the handler thread that finishes its batch wakes
        the loop to collect it instead of leaving it for the next look."""
        if callback is not None and not self.in_flight and not self.batched:
            self.when_idle(None)
            callback()
            return
        if (self._on_idle is None) != (callback is None):
            self.watched += 1 if callback is not None else -1
        self._on_idle = callback

    def _changed(self) -> None:
        """Messages finished: wake the waiting loops, and run when_idle's callback if that was
        the last in flight."""
        self.wake()
        if self._on_idle is not None and not self.in_flight and not self.batched:
            callback, self._on_idle = self._on_idle, None
            self.watched -= 1
            callback()

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
        self._in_order = True
        self.batches.clear()
        self.batched = 0
        self.bytes = 0
        self.needs_offset = True
        self._changed()

    @property
    def count(self) -> int:
        """Messages in flight (pulled, not finished)."""
        return len(self.in_flight) + self.batched

    def add(self, messages: list[ReceivedMessage]) -> None:
        """Messages in flight one by one (a list is in offset order)."""
        in_flight = self.in_flight
        if messages and in_flight and self._in_order and messages[0].queue_offset < next(reversed(in_flight)):
            self._in_order = False
        for m in messages:
            in_flight[m.queue_offset] = m
            self.bytes += len(m.body)

    def add_batch(self, batch: PulledBatch) -> None:
        """A pulled batch is in flight as a whole (records finished from the front; see
        finish_batch)."""
        if batch.open:
            self.batches.append(batch)
            self.batched += len(batch)
            self.bytes += batch.nbytes

    def finish_batch(self, batch: PulledBatch, upto: int, failed: list[ReceivedMessage] = ()) -> None:
        """batch's records before `upto` are finished: handled, or failed and in `failed`, which
        stay in flight one by one (added before the batch moves on, so the committable offset never
        passes them). Records from `upto` on stay in flight with the batch."""
        if failed:
            self.add(failed)
        if batch.open and upto > batch.cursor:
            self.batched -= upto - batch.cursor
            batch.cursor = upto
            if upto >= len(batch):
                batch.open = False
                self.bytes -= batch.nbytes
                batches = self.batches  # finished ones leave the front now: their bytes are freed
                while batches and not batches[0].open:  # even while the pull loop waits at the broker
                    batches.popleft()
        self._changed()

    def done(self, message: ReceivedMessage) -> None:
        if self.in_flight.pop(message.queue_offset, None) is not None:
            self.bytes -= len(message.body)
            if not self.in_flight:
                self._in_order = True
        self._changed()

    def done_many(self, messages: list[ReceivedMessage]) -> None:
        pop = self.in_flight.pop
        freed = 0
        for m in messages:
            if pop(m.queue_offset, None) is not None:
                freed += len(m.body)
        self.bytes -= freed
        if not self.in_flight:
            self._in_order = True
        self._changed()

    def _lowest(self) -> int | None:
        """The smallest offset in flight, or None."""
        low = None
        if self.in_flight:
            low = next(iter(self.in_flight)) if self._in_order else min(self.in_flight)
        batches = self.batches  # its first is open: finish_batch drops finished ones from the front
        if batches:
            first = batches[0]
            offset = first.offset_at(first.cursor)
            if low is None or offset < low:
                low = offset
        return low

    def committable(self) -> int:
        low = self._lowest()
        return self.next_offset if low is None else low

    def span(self) -> int:
        low = self._lowest()
        return 0 if low is None else self.next_offset - low

    def is_full(self, max_messages: int, max_bytes: int, max_span: int) -> bool:
        """Flow control: stop pulling this queue while any limit is passed."""
        return (len(self.in_flight) + self.batched >= max_messages or self.bytes >= max_bytes
                or self.span() >= max_span)
