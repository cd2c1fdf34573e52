"""BacklogGate: how many of a push Consumer's queues catch up on a backlog at once.

A queue that the broker says has more stored than it pulled takes one of the gate's turns before
it pulls, and keeps it until everything it pulled while behind is handled (consumer.py,
`_BacklogSlot`). Caught-up queues never take one. The turns bound what a consumer catching up
holds in memory and what the broker builds for it at a time.

How many turns there are:
- at most `max_queues` (the consumer's `max_backlog_queues`, default `max(16, 2 * threads)`);
- while a blocking handler only computes (the handler pool keeps one worker busy, so every queue
  with a turn feeds that one worker), only as many as `max_bytes` covers: each queue with a turn
  holds up to its flow window, `min(flow_max_messages * bytes a message, flow_max_bytes)`, and a
  message's bytes are measured from the pull answers (a running mean of a record's wire size);
- never fewer than two a busy worker, so every worker the pool lets run has a queue to work on
  while another queue's pull is in flight. When the pool sees the handlers wait (they sleep or do
  I/O) it lets up to `threads` workers run, and the turns go back up to `max_queues` at once.
- Before any answer has said how large a message is, only those two a busy worker.

Why bytes: a push Consumer at its defaults drained 1M messages of 1 KiB over 100 queues at
0.98-1.16M msg/s with 16 queues catching up at once, and at 1.52-1.66M with 3-4 (over 4 queues:
1.66-1.82M); over 1000 queues 0.93-1.05M against 1.04-1.29M. 16 queues hold ~16-24 MiB of
answers the one busy worker has not reached yet; the time lost was spread over the loop thread
and the worker (bodies gone cold in the cache), not in any one call. With 100 B messages 16
queues stayed faster than 4 (2.15-2.18M against 1.50-1.74M msg/s over 1000 queues): there 16
windows are ~2.8 MB. docs/benchmarks.md, "Backlog turns by bytes".

The LitePullConsumer bounds its turns the same way (`RecordBytes`, `turns_within`): a queue with
a turn there holds one pull answer, its pull batch's ceiling of messages, and it has no worker
pool, so never fewer than two turns.

Guarantees: turns are given in the order queues asked for them; a queue waiting for a turn is
never passed over by one that asked later; `held` never exceeds `max_queues`; a lowered limit
takes no turn back (the queues holding one finish as before). Loop thread only, but `wake_soon`
may be called from any thread.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

MiB = 1024 * 1024
# Measured (module docstring): four queues of 1 KiB messages (a window of ~1.1 MB) fit, as a
# 4-queue topic's drain has; at 4 MiB three did, and a 4-queue topic's LitePullConsumer drain
# fell from 2.78 M to 2.20 M msg/s
DEFAULT_MAX_BACKLOG_BYTES = 5 * MiB
TURNS_PER_BUSY_WORKER = 2
SIZE_WEIGHT = 1 / 8  # of the newest answer in the running mean of a message's bytes


class RecordBytes:
    """A record's wire bytes (header included), a running mean over the pull answers seen; None
    before the first. The newest answer weighs SIZE_WEIGHT, so a change of message size shows
    within a few answers and one odd answer moves it little."""

    __slots__ = ("mean",)

    def __init__(self) -> None:
        self.mean: float | None = None

    def add(self, body_bytes: int, count: int) -> None:
        size = body_bytes / count
        mean = self.mean
        self.mean = size if mean is None else mean + (size - mean) * SIZE_WEIGHT

    def window(self, messages: int, most: float = math.inf) -> float | None:
        """What `messages` of them take, at most `most` bytes; None before the first answer."""
        mean = self.mean
        return None if mean is None else min(messages * mean, most)


def turns_within(max_queues: int, max_bytes: int, window_bytes: float | None, least: int) -> int:
    """How many queues may catch up at once: as many as `max_bytes` holds windows of
    `window_bytes` (what one of them holds; None: not known yet), but at least `least` and at
    most `max_queues` (and never none)."""
    fit = 0 if window_bytes is None else int(max_bytes // max(1.0, window_bytes))
    return max(1, min(max_queues, max(fit, least)))


class BacklogGate:
    """The turns of one consumer's queues that catch up (see the module docstring)."""

    __slots__ = ("max_queues", "max_bytes", "_flow_messages", "_flow_bytes", "busy_limit",
                 "held", "peak", "record_bytes", "_waiters", "_loop")

    def __init__(self, max_queues: int, max_bytes: int | None, flow_messages: int, flow_bytes: int,
                 busy_limit: Callable[[], int] | None = None) -> None:
        """`busy_limit`: how many handler workers may run now (HandlerPool.busy_limit; the
        consumer sets it once it has a pool), or None while no pool decides that (an async
        handler, whose runs are not bounded by threads): then only `max_queues` counts, as it
        does with `max_bytes` None."""
        self.max_queues = max_queues
        self.max_bytes = max_bytes
        self._flow_messages = flow_messages
        self._flow_bytes = flow_bytes
        self.busy_limit = busy_limit
        self.held = 0
        self.peak = 0
        self.record_bytes = RecordBytes()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    def limit(self) -> int:
        """How many queues may hold a turn now."""
        busy_limit = self.busy_limit
        if self.max_bytes is None or busy_limit is None:
            return self.max_queues
        return turns_within(self.max_queues, self.max_bytes,
                            self.record_bytes.window(self._flow_messages, self._flow_bytes),
                            TURNS_PER_BUSY_WORKER * busy_limit())

    async def take(self) -> None:
        """Wait for a turn (in the order asked) and hold it."""
        if not self._waiters and self.held < self.limit():
            self._hold()
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        self._pass_on()  # the limit may have risen since the last turn was passed on
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # given the turn as it was cancelled: pass it on
            elif waiter in self._waiters:  # else _pass_on already dropped it
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a turn back; the next queues in line take what the limit now allows."""
        self.held -= 1
        self._pass_on()

    def measured(self, body_bytes: int, count: int) -> None:
        """A pull answer of `count` records in `body_bytes`: update a message's bytes (and let
        queues in line through if the limit rose)."""
        self.record_bytes.add(body_bytes, count)
        if self._waiters:
            self._pass_on()

    def wake_soon(self) -> None:
        """(any thread) The handler pool let more workers run: queues in line may go on."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._pass_on)

    def _hold(self) -> None:
        self.held += 1
        if self.held > self.peak:
            self.peak = self.held

    def _pass_on(self) -> None:
        waiters = self._waiters
        while waiters and self.held < self.limit():
            waiter = waiters.popleft()
            if not waiter.done():
                self._hold()
                waiter.set_result(None)
