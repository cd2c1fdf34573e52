"""Delayed delivery: delay levels, absolute deliver-at times, and the retry/dead-letter send-back.

A delayed message is stored first in the system topic %SCHEDULE% (queue = delay level - 1; the
last queue holds absolute deliver-at times) with its real topic, queue and due time in properties.
The scheduler keeps a heap of pending (due, queue, offset) loaded from each schedule queue's
progress offset, and when one is due it copies the message to its real topic. Progress (the
smallest undelivered offset) and the delivered offsets above it are persisted (the store
engine's SchedulerProgress part), so a restart neither loses a message nor delivers one twice (a
crash between delivery and persist may deliver once more: at least once).

A consumer sends back a failed message: it goes to %RETRY%<group> through the same schedule
with the delay of its reconsume count (first retry at level 3), or to %DLQ%<group> once it has
been reconsumed more than the group's maximum.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import TYPE_CHECKING

from equeue_core import msgid, record
from equeue_core.broker.topics import DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC
from equeue_core.codes import Code
from equeue_core.contracts import AppendResult, ScheduleQueueProgress, ServerConnection
from equeue_core.errors import InvalidMessageError, ProtocolError
from equeue_core.frame import Frame

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

log = logging.getLogger("equeue.schedule")

PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QUEUE = "REAL_QUEUE"
PROP_DELIVER_AT = "DELIVER_AT"
PROP_RETRY_TOPIC = "RETRY_TOPIC"  # the original topic of a message in a retry or DLQ topic
PROP_ORIGIN_MSG_ID = "ORIGIN_MSG_ID"
FIRST_RETRY_LEVEL = 3
MAX_DELIVERY_ROUND = 10_000  # due messages copied per loop turn, so one turn never hogs the loop
_INTERNAL = (PROP_REAL_TOPIC, PROP_REAL_QUEUE, PROP_DELIVER_AT)


class Scheduler:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.levels = broker.delay_levels
        self.absolute_queue = len(self.levels)
        self.queue_count = len(self.levels) + 1
        self._heap: list[tuple[int, int, int, int]] = []  # (due ms, queue, offset, position)
        self._pending: dict[int, set[int]] = {}
        self._delivered: dict[int, set[int]] = {}
        self._next_offsets: dict[int, int] = {}  # per schedule queue: smallest undelivered offset
        self._wake = asyncio.Event()
        if broker.topics.topics.get(SCHEDULE_TOPIC, 0) < self.queue_count:
            broker.topics.create(SCHEDULE_TOPIC, self.queue_count, system=True)
        self._load()

    def handlers(self) -> dict:
        return {Code.SEND_BACK: self.on_send_back}

    # ---------------------------------------------------------------- state

    def _load(self) -> None:
        store = self.broker.store
        saved = self.broker.engine.schedule.load()
        for q in range(self.queue_count):
            lo, hi = store.queue_range(SCHEDULE_TOPIC, q)
            progress = saved.get(q)
            off = max(lo, progress.next_offset if progress is not None else lo)
            done = {o for o in progress.delivered if o >= off} if progress is not None else set()
            self._next_offsets[q] = off
            self._delivered[q] = done
            self._pending[q] = set()
            while off < hi:
                res = store.read_queue(SCHEDULE_TOPIC, q, off, 256, 8 << 20, None)
                for s in record.scan(res.records):
                    m = record.decode(res.records, s)
                    if m.queue_offset not in done:
                        self._push(q, m.queue_offset, m.position, int(m.properties.get(PROP_DELIVER_AT, 0)))
                if res.next_offset <= off:
                    break
                off = res.next_offset
        if self._heap:
            log.info("scheduler: %d delayed messages pending", len(self._heap))

    def _push(self, q: int, offset: int, position: int, due: int) -> None:
        heapq.heappush(self._heap, (due, q, offset, position))
        self._pending[q].add(offset)

    def _progress(self, queues: set[int]) -> dict[int, ScheduleQueueProgress]:
        """Move each touched schedule queue's progress (smallest undelivered offset) and return
        every queue's progress, to save."""
        for q in queues:
            pending = self._pending[q]
            progress = min(pending) if pending else self.broker.store.queue_range(SCHEDULE_TOPIC, q)[1]
            self._next_offsets[q] = progress
            self._delivered[q] = {o for o in self._delivered[q] if o >= progress}
        return {q: ScheduleQueueProgress(n, frozenset(self._delivered.get(q, ())))
                for q, n in self._next_offsets.items()}

    def progress(self) -> dict[int, int]:
        """Each schedule queue's smallest undelivered offset as last saved (retention keeps the rest)."""
        return dict(self._next_offsets)

    @property
    def pending(self) -> int:
        return len(self._heap)

    # ---------------------------------------------------------------- scheduling

    def due_time(self, header: dict) -> tuple[int, int] | None:
        """(queue, due ms) for a send header asking for a delay, None for a plain send."""
        level = header.get("delay_level")
        at = header.get("deliver_at")
        if at is not None:
            if not isinstance(at, int) or isinstance(at, bool):
                raise ProtocolError("deliver_at must be epoch milliseconds")
            return self.absolute_queue, at
        if level is not None:
            if not isinstance(level, int) or isinstance(level, bool) or level < 1:
                raise InvalidMessageError(f"delay_level must be 1..{len(self.levels)}, not {level!r}")
            level = min(level, len(self.levels))
            return level - 1, record.now_ms() + self.levels[level - 1]
        return None

    def schedule(self, real_topic: str, real_queue: int, messages: list[record.StoredMessage],
                 q: int, due: int) -> AppendResult:
        """Store messages in the schedule topic, due at `due` (ms), bound for real_topic/queue."""
        parts = []
        for m in messages:
            props = dict(m.properties)
            props.update({PROP_REAL_TOPIC: real_topic, PROP_REAL_QUEUE: str(real_queue),
                          PROP_DELIVER_AT: str(due)})
            parts.append(record.encode_record(SCHEDULE_TOPIC, m.body, m.tag, m.keys, props,
                                              born_ts=m.born_ts, reconsume=m.reconsume_times))
        batch = bytearray(b"".join(parts))
        starts = record.scan(batch)
        result = self.broker.append(SCHEDULE_TOPIC, q, batch, starts)
        for i, p in enumerate(result.positions):
            self._push(q, result.first_queue_offset + i, p, due)
        self._wake.set()
        return result

    def schedule_batch(self, topic: str, queue_id: int, batch: bytearray, starts: list[int],
                       q: int, due: int) -> AppendResult:
        return self.schedule(topic, queue_id, [record.decode(batch, s) for s in starts], q, due)

    async def run_forever(self) -> None:
        while True:
            now = record.now_ms()
            if not self._heap:
                timeout = None
            else:
                timeout = max(0.0, (self._heap[0][0] - now) / 1000)
            if timeout is None or timeout > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            try:
                touched, last = self._deliver_due(now)
                if touched:
                    # The copies are durable before the progress that skips them is (sync flush),
                    # and the fsync of the progress file runs off the event loop.
                    if last is not None:
                        await self.broker.durable(last)
                    await asyncio.to_thread(self.broker.engine.schedule.save, self._progress(touched))
            except Exception:
                log.exception("delivering delayed messages failed; retrying in 1 s")
                await asyncio.sleep(1)

    def _deliver_due(self, now: int) -> tuple[set[int], AppendResult | None]:
        """Copy up to MAX_DELIVERY_ROUND due messages to their real topics: (queues touched, last append)."""
        touched: set[int] = set()
        batches: dict[tuple[str, int], list[bytes]] = {}
        delivered = 0
        last: AppendResult | None = None
        while self._heap and self._heap[0][0] <= now and delivered < MAX_DELIVERY_ROUND:
            delivered += 1
            due, q, offset, position = heapq.heappop(self._heap)
            m = record.decode(self.broker.store.read_position(position))
            props = {k: v for k, v in m.properties.items() if k not in _INTERNAL}
            real_topic = m.properties[PROP_REAL_TOPIC]
            real_queue = int(m.properties.get(PROP_REAL_QUEUE, 0))
            batches.setdefault((real_topic, real_queue), []).append(record.encode_record(
                real_topic, m.body, m.tag, m.keys, props, born_ts=m.born_ts, reconsume=m.reconsume_times))
            self._pending[q].discard(offset)
            self._delivered[q].add(offset)
            touched.add(q)
        for (topic, queue_id), parts in batches.items():
            system = topic.startswith((RETRY_PREFIX, DLQ_PREFIX))
            n = self.broker.topics.queues(topic, create=True, system=system)
            batch = bytearray(b"".join(parts))
            last = self.broker.append(topic, min(queue_id, n - 1), batch, record.scan(batch))
        return touched, last

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
        return retry, self.schedule(retry, 0, [m], level - 1, record.now_ms() + self.levels[level - 1])

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
        where, result = self.send_back(group, position, max_reconsume, level)
        await self.broker.durable(result)
        return frame.response({"topic": where})

