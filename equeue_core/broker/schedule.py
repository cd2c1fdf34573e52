"""Delayed delivery: delay levels, absolute deliver-at times, and the retry/dead-letter send-back.

Where a delayed message waits
    A message sent with a delay level waits in the system topic `%SCHEDULE%`, queue = level - 1.
    A message sent with an absolute `deliver_at` waits in `%TIMER%`, a ring of `buckets` queues
    of `bucket_ms` each: the queue of a due time is `(max(due, now) // bucket_ms) % buckets`.
    The ring covers more than `max_deliver_delay` (`buckets = ceil(max / bucket_ms) + 2`), so a
    bucket only ever holds messages of one turn of the ring when it is read (proof: a message for
    the next turn of bucket b is due at least `buckets * bucket_ms` after b's current turn starts,
    so it can be sent no earlier than `2 * bucket_ms` after that start, when b's turn is over and
    b is closed). Queue `len(levels)` of `%SCHEDULE%` held absolute times before the ring existed;
    it is still drained, never written. Each waiting record carries its real topic, queue and due
    time in properties.

What is in memory (the window)
    The heap holds only what is due soon: level queues are read up to `now + LOOKAHEAD_MS` (a
    level queue's due times grow with its offsets, so reading stops at the first later one), and
    a `%TIMER%` bucket is opened (read whole) when its start comes within LOOKAHEAD_MS. A message
    due in 30 days therefore costs no memory until its bucket opens; more is loaded from the
    store as time advances. The heap is also capped at MAX_HEAP entries.

Progress (what is persisted)
    Per waiting queue: progress = the smallest offset not yet delivered (or the read cursor when
    nothing is pending), plus the delivered offsets above it and the start of the oldest ring
    bucket still open, saved through the store engine's SchedulerProgress part (ScheduleState). Progress passes only
    delivered messages: a far message is never passed, it simply sits in a bucket nobody reads
    yet, so near messages in other queues move on freely. All reads and writes of this state go
    through `_load_progress()` / `_save_progress()`.

Delivery is copy-then-mark
    A due message is copied to its real topic first and marked delivered only after the copy
    was appended; its progress is persisted only after the copy is durable (sync flush). A crash
    between copy and mark delivers it once more (at least once), never zero times.
    - A transient failure (the store refuses the append: disk full, I/O error) keeps the message
      pending and retries it after a backoff (1 s doubling to 60 s).
    - A message that cannot be delivered goes to a dead-letter topic with a `DLQ_REASON`
      property: its real topic was deleted, or the append refused it for good. Retry messages
      (bound for `%RETRY%<group>`) go to `%DLQ%<group>`; plain delayed messages go to
      `%DLQ%%SCHEDULE%` (read it with `equeue groups dlq %SCHEDULE%`).
    - A record that does not parse as a waiting message (no real topic, bad numbers), or that
      could not be read MAX_READ_ATTEMPTS times, goes to the quarantine topic `%QUARANTINE%` with `QUARANTINE_REASON` and
      `QUARANTINE_SOURCE` (topic/queue@offset), so it never pins its queue.

A consumer sends back a failed message: it goes to %RETRY%<group> through the same schedule
with the delay of its reconsume count (first retry at level 3), or to %DLQ%<group> once it has
been reconsumed more than the group's maximum.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from equeue_core import msgid, record
from equeue_core.broker.topics import (
    DLQ_PREFIX,
    QUARANTINE_TOPIC,
    RETRY_PREFIX,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
)
from equeue_core.codes import Code
from equeue_core.config import parse_duration_ms
from equeue_core.contracts import AppendResult, ScheduleQueueProgress, ScheduleState, ServerConnection
from equeue_core.errors import (
    DelayTooLongError,
    EQueueError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    ProtocolError,
    StoreError,
)
from equeue_core.frame import Frame
from equeue_core.threads import run_to_end

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

log = logging.getLogger("equeue.schedule")

PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QUEUE = "REAL_QUEUE"
PROP_DELIVER_AT = "DELIVER_AT"
PROP_RETRY_TOPIC = "RETRY_TOPIC"  # the original topic of a message in a retry or DLQ topic
PROP_ORIGIN_MSG_ID = "ORIGIN_MSG_ID"
PROP_DLQ_REASON = "DLQ_REASON"
PROP_QUARANTINE_REASON = "QUARANTINE_REASON"
PROP_QUARANTINE_SOURCE = "QUARANTINE_SOURCE"
SCHEDULE_GROUP = "%SCHEDULE%"
SCHEDULE_DLQ = DLQ_PREFIX + SCHEDULE_GROUP  # dead letters of plain delayed messages
FIRST_RETRY_LEVEL = 3
MAX_DELIVERY_ROUND = 10_000  # due messages copied per loop turn, so one turn never hogs the loop
LOOKAHEAD_MS = 10_000  # the heap holds what is due within this window (plus the open buckets)
MAX_HEAP = 500_000  # never load more than this many waiting messages into memory
SCAN_INTERVAL_S = 1.0  # how often the window moves on when nothing is due earlier
HOUR_MS = 3_600_000
MAX_BUCKETS = 1000  # ring size limit (a topic has at most 1024 queues)
BACKOFF_MS = (1_000, 60_000)  # transient delivery failure: first retry, longest wait
MAX_READ_ATTEMPTS = 5  # a waiting record that cannot be read this often is quarantined
_INTERNAL = (PROP_REAL_TOPIC, PROP_REAL_QUEUE, PROP_DELIVER_AT)

Key = tuple[str, int]  # (waiting topic, queue)


class MalformedScheduleRecord(Exception):
    """A record in a schedule queue that is not a well-formed waiting message."""


@dataclass
class ScheduleProgress:
    """What the scheduler persists (see the module docstring)."""

    offsets: dict[Key, int] = field(default_factory=dict)  # progress per waiting queue
    delivered: dict[Key, set[int]] = field(default_factory=dict)  # delivered above progress
    open_from: int | None = None  # start (ms) of the oldest ring bucket not finished
    bucket_ms: int | None = None
    buckets: int | None = None


def ring_layout(max_delay_ms: int) -> tuple[int, int]:
    """(bucket_ms, buckets) of a ring that covers max_delay_ms (see the module docstring)."""
    bucket_ms = max(HOUR_MS, math.ceil(max_delay_ms / (MAX_BUCKETS - 2)))
    return bucket_ms, math.ceil(max_delay_ms / bucket_ms) + 2


class Scheduler:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.levels = broker.delay_levels
        self.legacy_queue = len(self.levels)  # absolute times, before the ring existed
        self.queue_count = len(self.levels) + 1
        self._heap: list[tuple[int, str, int, int, int]] = []  # (due ms, topic, queue, offset, position)
        self._pending: dict[Key, set[int]] = {}  # offsets in the heap (or backing off) per queue
        self._delivered: dict[Key, set[int]] = {}
        self._cursor: dict[Key, int] = {}  # next offset to read into the heap
        self._limit: dict[Key, int] = {}  # open queues: load messages due at or before this
        self._blocked: dict[Key, int] = {}  # due time of the first message not loaded
        self._attempts: dict[tuple[Key, int], int] = {}  # transient failures per waiting message
        self._read_again_at: dict[Key, int] = {}  # a read failed: not before this time (ms)
        self.counts = {"delivered": 0, "dead_lettered": 0, "quarantined": 0, "retried": 0}
        self._wake = asyncio.Event()
        self._saved: int | None = None  # the open_from last persisted
        self._settled: set[tuple[str, int, int]] = set()  # marked or backing off, this round
        topics = broker.topics
        if topics.topics.get(SCHEDULE_TOPIC, 0) < self.queue_count:
            topics.create(SCHEDULE_TOPIC, self.queue_count, system=True)
        self.max_delay_ms = parse_duration_ms(broker.config.max_deliver_delay)
        self.bucket_ms, self.buckets = ring_layout(self.max_delay_ms)
        state = self._load_progress(self.queue_count, self.buckets)
        if state.bucket_ms and state.buckets and TIMER_TOPIC in topics.topics:
            self.bucket_ms, self.buckets = state.bucket_ms, state.buckets  # data is laid out so
            capacity = (self.buckets - 2) * self.bucket_ms
            if capacity < self.max_delay_ms:
                log.warning("max_deliver_delay is capped at %d ms by the existing %s layout",
                            capacity, TIMER_TOPIC)
                self.max_delay_ms = capacity
        if topics.topics.get(TIMER_TOPIC, 0) < self.buckets:
            topics.create(TIMER_TOPIC, self.buckets, system=True)
        self._state = state
        self._open_from = state.open_from
        self._opened_until = state.open_from
        for q in range(self.queue_count):
            self._open((SCHEDULE_TOPIC, q), 0)
        self._advance(record.now_ms())
        if self._heap:
            log.info("scheduler: %d delayed messages due soon", len(self._heap))

    def handlers(self) -> dict:
        return {Code.SEND_BACK: self.on_send_back}

    # ---------------------------------------------------------------- persisted progress

    def _load_progress(self, queue_count: int, max_buckets: int) -> ScheduleProgress:
        """Read the persisted state from the store engine's SchedulerProgress part. Queues other
        than the `queue_count` level queues and the ring's buckets (the saved ring size, else
        `max_buckets`) are left out: they belong to no waiting queue any more."""
        saved = self.broker.engine.schedule.load()
        state = ScheduleProgress(open_from=saved.timer_open_from, bucket_ms=saved.timer_bucket_ms,
                                 buckets=saved.timer_buckets)
        keys = {(SCHEDULE_TOPIC, q) for q in range(queue_count)}
        keys |= {(TIMER_TOPIC, q) for q in range(state.buckets or max_buckets)}
        for key, progress in saved.queues.items():
            if key in keys:
                state.offsets[key] = progress.next_offset
                state.delivered[key] = set(progress.delivered)
        return state

    def _save_progress(self, state: ScheduleProgress) -> None:
        """Persist a snapshot taken by _progress() (runs on a worker thread: it fsyncs)."""
        queues = {key: ScheduleQueueProgress(off, frozenset(state.delivered.get(key, ())))
                  for key, off in state.offsets.items()}
        self.broker.engine.schedule.save(ScheduleState(queues, state.open_from, state.bucket_ms, state.buckets))

    def _progress(self) -> ScheduleProgress:
        """Snapshot of the progress of every queue read in this run (on the event loop)."""
        state = ScheduleProgress(open_from=self._open_from, bucket_ms=self.bucket_ms, buckets=self.buckets)
        for key, progress in self.progress().items():
            state.offsets[key] = progress
            self._delivered[key] = {o for o in self._delivered.get(key, ()) if o >= progress}
            state.delivered[key] = set(self._delivered[key])
        return state

    # ---------------------------------------------------------------- the window

    def _open(self, key: Key, limit: int) -> None:
        """Start reading a waiting queue into the heap (from its progress) up to due `limit`."""
        if key not in self._cursor:
            lo = self.broker.store.queue_range(*key)[0]
            self._cursor[key] = max(lo, self._state.offsets.get(key, lo))
            self._delivered[key] = {o for o in self._state.delivered.get(key, ()) if o >= self._cursor[key]}
            self._pending.setdefault(key, set())
        self._limit[key] = limit
        self._blocked.pop(key, None)

    def _bucket(self, due: int, now: int) -> int:
        return (max(due, now) // self.bucket_ms) % self.buckets

    def _advance(self, now: int) -> None:
        """Move the window to now: open ring buckets that start within LOOKAHEAD_MS, close the
        finished ones, read what came due from every open queue."""
        horizon = now + LOOKAHEAD_MS
        w = self.bucket_ms
        last = horizon // w * w
        start = self._opened_until if self._opened_until is not None else now // w * w
        start = max(start, last - (self.buckets - 1) * w)  # after a long stop: each bucket once
        while start <= last:
            self._open((TIMER_TOPIC, (start // w) % self.buckets), start + w - 1)
            start += w
        self._opened_until = start
        for q in range(len(self.levels)):
            self._limit[(SCHEDULE_TOPIC, q)] = horizon
        self._limit[(SCHEDULE_TOPIC, self.legacy_queue)] = 2 ** 62
        oldest = None
        for key, limit in list(self._limit.items()):
            if (len(self._heap) < MAX_HEAP and self._blocked.get(key, -1) <= limit
                    and self._read_again_at.get(key, 0) <= now):
                self._read_again_at.pop(key, None)
                self._read(key, limit)
            if key[0] == TIMER_TOPIC:
                if limit < now and not self._pending[key] and self._read_all(key, limit):
                    del self._limit[key]  # this turn of the bucket is over
                else:
                    oldest = limit - w + 1 if oldest is None else min(oldest, limit - w + 1)
        self._open_from = oldest if oldest is not None else self._opened_until

    def _read_all(self, key: Key, limit: int) -> bool:
        """Whether every message of this turn of an open queue was read into the heap."""
        if key in self._read_again_at:
            return False
        return self._blocked.get(key, -1) > limit or self._cursor[key] >= self.broker.store.queue_range(*key)[1]

    def _read(self, key: Key, limit: int) -> None:
        """Load messages of one waiting queue due at or before `limit` into the heap."""
        store = self.broker.store
        topic, q = key
        off = self._cursor[key]
        lo, hi = store.queue_range(topic, q)
        off = max(off, lo)
        done = self._delivered[key]
        while off < hi and len(self._heap) < MAX_HEAP:
            try:
                res = store.read_queue(topic, q, off, 256, 8 << 20, None)
            except OffsetOutOfRangeError as e:  # retention released the start of the queue
                off = e.min_offset
                continue
            except EQueueError as e:
                log.warning("reading %s/%d@%d failed: %s; trying again in 10 s", topic, q, off, e)
                self._cursor[key] = off
                self._read_again_at[key] = record.now_ms() + 10_000
                return
            for s in record.scan(res.records):
                f = record.header_fields(res.records, s)
                pos, qoff = f[5], f[6]
                if qoff in done:
                    off = qoff + 1
                    continue
                try:
                    due = int(record.decode(res.records, s).properties.get(PROP_DELIVER_AT, 0))
                except Exception:  # malformed: due now, delivery quarantines it
                    due = 0
                if due > limit:
                    self._cursor[key] = off
                    self._blocked[key] = due
                    return
                self._push(key, qoff, pos, due)
                off = qoff + 1
            if res.next_offset <= off and not res.count:
                break
            off = max(off, res.next_offset)
        self._cursor[key] = off
        self._blocked.pop(key, None)

    def _push(self, key: Key, offset: int, position: int, due: int) -> None:
        heapq.heappush(self._heap, (due, key[0], key[1], offset, position))
        self._pending[key].add(offset)

    @property
    def pending(self) -> int:
        """Delayed messages and retries stored and not delivered yet, in memory or not."""
        store = self.broker.store
        read = self.progress()
        waiting = 0
        for topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            for q in store.queues().get(topic, ()):
                key = (topic, q)
                lo, hi = store.queue_range(topic, q)
                start = max(lo, read.get(key, self._state.offsets.get(key, lo)))
                done = self._delivered.get(key, self._state.delivered.get(key, ()))
                waiting += max(0, hi - start - sum(1 for o in done if start <= o < hi))
        return waiting

    def progress(self) -> dict[Key, int]:
        """Each waiting queue read in this run: its smallest undelivered offset (what retention
        must keep; a queue not listed was not read and keeps everything from its start)."""
        return {key: (min(self._pending[key]) if self._pending.get(key) else cursor)
                for key, cursor in sorted(self._cursor.items())}

    def stats(self) -> dict:
        """Numbers an operator (and a test) can read through BROKER_INFO."""
        return {"waiting": self.pending, "in_memory": len(self._heap), "open_queues": len(self._limit),
                "backing_off": len(self._attempts), "max_delay_ms": self.max_delay_ms,
                "bucket_ms": self.bucket_ms, "buckets": self.buckets,
                "progress": {f"{t}:{q}": off for (t, q), off in self.progress().items()},
                **self.counts}

    # ---------------------------------------------------------------- scheduling

    def due_time(self, header: dict) -> tuple[Key, int] | None:
        """(waiting queue, due ms) for a send header asking for a delay, None for a plain send."""
        level = header.get("delay_level")
        at = header.get("deliver_at")
        if at is not None:
            if not isinstance(at, int) or isinstance(at, bool):
                raise ProtocolError("deliver_at must be epoch milliseconds")
            now = record.now_ms()
            if at - now > self.max_delay_ms:
                raise DelayTooLongError(
                    f"deliver_at is {(at - now) / 86_400_000:.1f} days away; the broker's "
                    f"max_deliver_delay is {self.max_delay_ms / 86_400_000:g} days",
                    max_delay_ms=self.max_delay_ms)
            return (TIMER_TOPIC, self._bucket(at, now)), at
        if level is not None:
            if not isinstance(level, int) or isinstance(level, bool) or level < 1:
                raise InvalidMessageError(f"delay_level must be 1..{len(self.levels)}, not {level!r}")
            level = min(level, len(self.levels))
            return (SCHEDULE_TOPIC, level - 1), record.now_ms() + self.levels[level - 1]
        return None

    def schedule(self, real_topic: str, real_queue: int, messages: list[record.StoredMessage],
                 key: Key, due: int) -> AppendResult:
        """Store messages in a waiting queue, due at `due` (ms), bound for real_topic/queue."""
        parts = []
        for m in messages:
            props = dict(m.properties)
            props.update({PROP_REAL_TOPIC: real_topic, PROP_REAL_QUEUE: str(real_queue),
                          PROP_DELIVER_AT: str(due)})
            parts.append(record.encode_record(key[0], m.body, m.tag, m.keys, props,
                                              born_ts=m.born_ts, reconsume=m.reconsume_times))
        batch = bytearray(b"".join(parts))
        starts = record.scan(batch)
        result = self.broker.append(key[0], key[1], batch, starts)
        limit = self._limit.get(key)
        # caught up with this queue and due within its window: straight to the heap
        if (limit is not None and due <= limit and self._cursor.get(key) == result.first_queue_offset
                and not self._blocked.get(key) and len(self._heap) < MAX_HEAP):
            for i, p in enumerate(result.positions):
                self._push(key, result.first_queue_offset + i, p, due)
            self._cursor[key] = result.first_queue_offset + len(result.positions)
            self._wake.set()
        return result

    def schedule_batch(self, topic: str, queue_id: int, batch: bytearray, starts: list[int],
                       key: Key, due: int) -> AppendResult:
        return self.schedule(topic, queue_id, [record.decode(batch, s) for s in starts], key, due)

    async def run_forever(self) -> None:
        while True:
            try:
                now = record.now_ms()
                self._advance(now)
                timeout = SCAN_INTERVAL_S
                if self._heap:
                    timeout = min(timeout, max(0.0, (self._heap[0][0] - now) / 1000))
                if timeout > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    except TimeoutError:
                        pass
                    if not self._heap or self._heap[0][0] > record.now_ms():
                        await self._persist_if_moved()
                        continue
                last = self._deliver_due(record.now_ms())
                if last is not None:
                    # The copies are durable before the progress that passes them is (sync
                    # flush), and the fsync of the progress file runs off the event loop.
                    await self.broker.durable(last)
                    await run_to_end(self._save_progress, self._progress())
                    self._saved = self._open_from
            except Exception:
                log.exception("delivering delayed messages failed; retrying in 1 s")
                await asyncio.sleep(1)

    async def _persist_if_moved(self) -> None:
        """Persist when the ring moved on without a delivery (a bucket closed), so a restart does
        not reopen finished buckets."""
        if self._open_from != self._saved:
            await run_to_end(self._save_progress, self._progress())
            self._saved = self._open_from

    # ---------------------------------------------------------------- delivery

    def _deliver_due(self, now: int) -> AppendResult | None:
        """Copy up to MAX_DELIVERY_ROUND due messages to their real topics, then mark them.
        Returns the last append (None if nothing was stored)."""
        due_now: list[tuple[int, str, int, int, int]] = []
        while self._heap and self._heap[0][0] <= now and len(due_now) < MAX_DELIVERY_ROUND:
            due_now.append(heapq.heappop(self._heap))
        self._settled = set()
        try:
            return self._deliver(due_now, now)
        except Exception as e:  # a bug: nothing popped may vanish, each one waits and is tried again
            for entry in due_now:
                if entry[1:4] not in self._settled:
                    self._back_off(entry, now, e)
            raise

    def _deliver(self, due_now: list[tuple[int, str, int, int, int]], now: int) -> AppendResult | None:
        batches: dict[tuple[str, int], list[tuple[tuple, bytes]]] = {}
        dead: list[tuple[tuple, record.StoredMessage, str]] = []
        bad: list[tuple[tuple, bytes, str]] = []
        for entry in due_now:
            try:
                m, topic, queue = self._target(entry)
            except MalformedScheduleRecord as e:
                bad.append((entry, e.args[1], e.args[0]))
                continue
            except EQueueError as e:  # could not read it: maybe passing, so try again a few times
                if self._attempts.get(((entry[1], entry[2]), entry[3]), 0) < MAX_READ_ATTEMPTS:
                    self._back_off(entry, now, e)
                else:
                    bad.append((entry, b"", f"unreadable: {e.code}: {e}"))
                continue
            props = {k: v for k, v in m.properties.items() if k not in _INTERNAL}
            if not topic.startswith(RETRY_PREFIX) and topic not in self.broker.topics.topics:
                dead.append((entry, m, f"topic_not_found: topic {topic!r} does not exist (deleted?)"))
                continue
            try:
                encoded = record.encode_record(topic, m.body, m.tag, m.keys, props, born_ts=m.born_ts,
                                               reconsume=m.reconsume_times)
            except Exception as e:
                dead.append((entry, m, f"{getattr(e, 'code', type(e).__name__)}: {e}"))
                continue
            batches.setdefault((topic, queue), []).append((entry, encoded))
        last: AppendResult | None = None
        for (topic, queue_id), items in batches.items():
            try:
                n = self.broker.topics.queues(topic, create=True, system=topic.startswith(RETRY_PREFIX))
                batch = bytearray(b"".join(e for _, e in items))
                last = self.broker.append(topic, min(queue_id, n - 1), batch, record.scan(batch))
            except EQueueError as e:
                if isinstance(e, StoreError):
                    for entry, _ in items:
                        self._back_off(entry, now, e)
                else:  # refused for good: each one to its dead-letter topic
                    for entry, _ in items:
                        dead.append((entry, self._message(entry), f"{e.code}: {e}"))
                continue
            except Exception as e:  # an I/O error below the store: transient
                for entry, _ in items:
                    self._back_off(entry, now, e)
                continue
            self.counts["delivered"] += len(items)
            for entry, _ in items:
                self._mark(entry)
        for entry, m, reason in dead:
            last = self._set_aside(entry, now, reason, self._dead_letter, m) or last
        for entry, raw, reason in bad:
            last = self._set_aside(entry, now, reason, self._quarantine, raw) or last
        return last

    def _message(self, entry: tuple) -> record.StoredMessage:
        return record.decode(self.broker.store.read_position(entry[4]))

    def _target(self, entry: tuple) -> tuple[record.StoredMessage, str, int]:
        """(message, real topic, real queue) of a waiting entry; MalformedScheduleRecord(reason,
        raw) when the record is not a well-formed waiting message."""
        raw = self.broker.store.read_position(entry[4])  # EQueueError: unreadable
        try:
            m = record.decode(raw)
            topic = m.properties[PROP_REAL_TOPIC]
            queue = int(m.properties.get(PROP_REAL_QUEUE, 0))
            if not isinstance(topic, str) or not topic or queue < 0:
                raise ValueError(f"bad real topic/queue {topic!r}/{queue}")
        except KeyError as e:
            raise MalformedScheduleRecord(f"malformed: no {e.args[0]} property", bytes(raw)) from None
        except Exception as e:
            raise MalformedScheduleRecord(f"malformed: {type(e).__name__}: {e}", bytes(raw)) from None
        return m, topic, queue

    def _mark(self, entry: tuple) -> None:
        _due, topic, q, offset, _pos = entry
        key = (topic, q)
        self._settled.add((topic, q, offset))
        self._pending[key].discard(offset)
        self._delivered[key].add(offset)
        self._attempts.pop((key, offset), None)

    def _back_off(self, entry: tuple, now: int, error: Exception) -> None:
        """Keep a message pending and try it again later (the cause may go away)."""
        key = (entry[1], entry[2])
        self._settled.add(entry[1:4])
        n = self._attempts.get((key, entry[3]), 0) + 1
        self._attempts[(key, entry[3])] = n
        wait = min(BACKOFF_MS[1], BACKOFF_MS[0] << min(n - 1, 16))
        if n == 1 or n % 10 == 0:
            log.warning("delivering %s/%d@%d failed (%s); attempt %d, next in %d ms",
                        entry[1], entry[2], entry[3], error, n, wait)
        self.counts["retried"] += 1
        heapq.heappush(self._heap, (now + wait, *entry[1:]))

    def _set_aside(self, entry: tuple, now: int, reason: str, store_fn, what) -> AppendResult | None:
        try:
            result = store_fn(entry, what, reason)
        except Exception as e:
            self._back_off(entry, now, e)
            return None
        self._mark(entry)
        return result

    def _dead_letter(self, entry: tuple, m: record.StoredMessage, reason: str) -> AppendResult:
        """Store an undeliverable waiting message in its dead-letter topic, with the reason."""
        real = m.properties.get(PROP_REAL_TOPIC, "")
        dlq = DLQ_PREFIX + real[len(RETRY_PREFIX):] if real.startswith(RETRY_PREFIX) else SCHEDULE_DLQ
        props = {k: v for k, v in m.properties.items() if k not in _INTERNAL}
        props.setdefault(PROP_RETRY_TOPIC, real)
        props.setdefault(PROP_ORIGIN_MSG_ID, msgid.encode(*self.broker.address, entry[4]))
        props[PROP_DLQ_REASON] = reason
        log.warning("delayed message %s/%d@%d bound for %s is undeliverable (%s): moved to %s",
                    entry[1], entry[2], entry[3], real, reason, dlq)
        self.broker.topics.queues(dlq, create=True, system=True)
        batch = bytearray(record.encode_record(dlq, m.body, m.tag, m.keys, props, born_ts=m.born_ts,
                                               reconsume=m.reconsume_times))
        self.counts["dead_lettered"] += 1
        return self.broker.append(dlq, 0, batch, record.scan(batch))

    def _quarantine(self, entry: tuple, raw: bytes, reason: str) -> AppendResult:
        """Store a malformed waiting record in %QUARANTINE%: its bytes as the body, where it was
        and why in properties."""
        source = f"{entry[1]}/{entry[2]}@{entry[3]}"
        log.error("malformed record %s (position %d): %s; moved to %s", source, entry[4], reason,
                  QUARANTINE_TOPIC)
        return self.quarantine(raw, source, reason)

    def quarantine(self, raw: bytes, source: str, reason: str) -> AppendResult:
        """Keep a record a system topic cannot use, so it is neither lost nor retried forever."""
        self.broker.topics.queues(QUARANTINE_TOPIC, create=True, system=True)
        props = {PROP_QUARANTINE_REASON: reason, PROP_QUARANTINE_SOURCE: source}
        batch = bytearray(record.encode_record(QUARANTINE_TOPIC, bytes(raw), None, (), props))
        self.counts["quarantined"] += 1
        return self.broker.append(QUARANTINE_TOPIC, 0, batch, record.scan(batch))

    # ---------------------------------------------------------------- retry and dead letters

    def send_back(self, group: str, position: int, max_reconsume: int,
                  delay_level: int | None = None) -> tuple[str, AppendResult]:
        """Move a failed message to the group's retry topic (delayed) or its DLQ: (topic, append)."""
        m = record.decode(self.broker.store.read_position(position))
        props = dict(m.properties)
        props.setdefault(PROP_RETRY_TOPIC, m.topic)
        props.setdefault(PROP_ORIGIN_MSG_ID, msgid.encode(*self.broker.address, position))
        m.properties = props
        m.reconsume_times += 1
        if m.reconsume_times > max_reconsume or (delay_level is not None and delay_level < 0):
            dlq = DLQ_PREFIX + group
            self.broker.topics.queues(dlq, create=True, system=True)
            batch = bytearray(record.encode_record(dlq, m.body, m.tag, m.keys, props,
                                                   born_ts=m.born_ts, reconsume=m.reconsume_times))
            return dlq, self.broker.append(dlq, 0, batch, record.scan(batch))
        retry = RETRY_PREFIX + group
        self.broker.topics.queues(retry, create=True, system=True)
        level = delay_level or (FIRST_RETRY_LEVEL + m.reconsume_times - 1)
        level = max(1, min(level, len(self.levels)))
        return retry, self.schedule(retry, 0, [m], (SCHEDULE_TOPIC, level - 1),
                                    record.now_ms() + self.levels[level - 1])

    async def on_send_back(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        group = h.get("group")
        msg = h.get("msg_id")
        max_reconsume = h.get("max_reconsume", self.broker.config.max_reconsume_times)
        level = h.get("delay_level")
        if not isinstance(group, str) or not isinstance(msg, str) or not isinstance(max_reconsume, int):
            raise ProtocolError("send-back needs group, msg_id and max_reconsume")
        if level is not None and not isinstance(level, int):
            raise ProtocolError("delay_level must be an integer")
        _h, _p, position = msgid.decode(msg)
        # A send-back is a write its consumer acts on (it commits past the message once this is
        # answered), so it is acknowledged as a SEND is: with sync replication only once the
        # replicas have it, watched from the turn that stores it (Master.watch)
        replication = self.broker.replication
        sync = replication.sync_write()  # not_enough_replicas before storing
        where, result = self.send_back(group, position, max_reconsume, level)
        if sync:
            await self.broker.acknowledged(result.end_position, replication.watch_replicated(result.end_position))
        else:
            await self.broker.durable(result)
        return frame.response({"topic": where})
