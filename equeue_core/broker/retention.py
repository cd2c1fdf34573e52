"""Retention: release stored data that is old enough and (by default) consumed by every group.

The store contract has one retention call, `delete_before(position)`; this module finds the
position. Positions grow with every append, and within a queue they grow with the queue offset,
so for a cutoff time the smallest "position of the first record newer than the cutoff" over all
queues bounds a prefix of the store in which every record is older than the cutoff. The same
argument with each group's committed offset bounds a prefix every group has consumed. With the
default policy `time_and_consumed` the store releases the smaller of the two; a queue nobody
subscribes to counts as unconsumed, except dead-letter topics, which age out by time alone.

Off the event loop: each round (its searches, the delete, RocksDB's compaction) runs on a worker
thread while the broker goes on serving. That is safe because everything a round reads is safe to
read from any thread (store reads by contract, `offsets.all()` under its lock, copies of the
scheduler's progress), and the one thing it writes, `MessageStore.delete_before`, is promised by
the store contract to be safe beside the single writer's appends (each store says why in its
docstring: the LMDB and RocksDB stores serialize it with append under a write lock; the file
store only removes whole chunks below the one being written). Rounds never overlap: the next one
starts after the previous one returned.

Disk relief: above the disk high-water mark a round releases the oldest tenth of the bytes the
store holds, consumed or not. A store whose file does not shrink (LMDB) keeps what it released as
free pages (`reusable_bytes`); once those are a tenth of what it holds, releasing more would not
give the disk anything back, only lose data, so relief waits until the store has reused them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from typing import TYPE_CHECKING

from equeue_core import record
from equeue_core.broker.topics import DLQ_PREFIX
from equeue_core.errors import EQueueError
from equeue_core.threads import run_to_end

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

log = logging.getLogger("equeue.retention")

POLICIES = ("time_and_consumed", "time", "consumed")
INFINITE = 1 << 63


class RetentionCleaner:
    def __init__(self, broker: Broker, hours: float, policy: str, interval_s: float,
                 disk_high_water: float = 0.85) -> None:
        self.broker = broker
        self.retention_ms = int(hours * 3_600_000)
        self.policy = policy
        self.interval_s = interval_s
        self.disk_high_water = disk_high_water
        self.released = 0

    def _position_at(self, topic: str, queue_id: int, offset: int) -> int:
        """Position of the record at offset, or INFINITE when offset is past the queue's end."""
        store = self.broker.store
        lo, hi = store.queue_range(topic, queue_id)
        if offset >= hi:
            return INFINITE
        res = store.read_queue(topic, queue_id, max(offset, lo), 1, 1 << 30, None)
        if not res.count:
            return INFINITE
        return record.header_fields(res.records)[5]

    def time_bound(self, now_ms: int) -> int:
        return self.bound_before(now_ms - self.retention_ms)

    def bound_before(self, cutoff: int) -> int:
        """A position below which every record was stored before cutoff (ms)."""
        bound = INFINITE
        for topic, queues in self.broker.store.queues().items():
            for q in queues:
                off = self.broker.store.offset_for_timestamp(topic, q, cutoff)
                bound = min(bound, self._position_at(topic, q, off))
        return bound

    def consumed_bound(self) -> int:
        store = self.broker.store
        committed: dict[tuple[str, int], list[int]] = {}
        for (_group, topic, q), off in self.broker.offsets.all().items():
            committed.setdefault((topic, q), []).append(off)
        # the scheduler consumes its waiting queues (%SCHEDULE% levels, %TIMER% buckets); one it
        # has not read yet in this run is kept from its start
        for key, off in self.broker.scheduler.progress().items():
            committed.setdefault(key, []).append(off)
        bound = INFINITE
        for topic, queues in store.queues().items():
            if topic.startswith(DLQ_PREFIX):
                continue
            for q in queues:
                offs = committed.get((topic, q))
                start = min(offs) if offs else store.queue_range(topic, q)[0]
                bound = min(bound, self._position_at(topic, q, start))
        return bound

    def disk_used(self) -> float:
        usage = shutil.disk_usage(self.broker.config.data_dir)
        return usage.used / usage.total if usage.total else 0.0

    def _head_position(self) -> int:
        """Position of the oldest record still stored (INFINITE if the store is empty)."""
        store = self.broker.store
        head = INFINITE
        for topic, queues in store.queues().items():
            for q in queues:
                head = min(head, self._position_at(topic, q, store.queue_range(topic, q)[0]))
        return head

    def relieve_disk(self) -> int:
        """Above the disk high-water mark, release the oldest tenth of the bytes the store holds,
        consumed or not, and say so loudly: losing old data beats refusing new sends. Skipped
        while the store's own free space is already a tenth of what it holds (module docstring)."""
        used = self.disk_used()
        if used < self.disk_high_water:
            return 0
        store = self.broker.store
        head, end = self._head_position(), self._end_position()
        held = end - head if head != INFINITE else 0
        if held <= 0:
            return 0
        reusable = store.reusable_bytes()
        if reusable * 10 >= held:
            log.info("disk %.0f%% full (high-water mark %.0f%%), but the store already has %d bytes free "
                     "inside its files (%d held): nothing more released", used * 100,
                     self.disk_high_water * 100, reusable, held)
            return 0
        released = 0
        step = max(1, held // 10)
        while not released:  # a store releases whole units (file chunks): widen until one goes
            target = min(end, head + step)
            released = store.delete_before(target)
            if target >= end:
                break
            step *= 2
        log.warning("DISK %.0f%% FULL (high-water mark %.0f%%): released %d bytes of the oldest "
                    "messages, consumed or not", used * 100, self.disk_high_water * 100, released)
        self.released += released
        return released

    def clean_once(self, now_ms: int | None = None) -> int:
        """Release what the policy allows; returns what the store reports released."""
        now_ms = record.now_ms() if now_ms is None else now_ms
        relieved = self.relieve_disk()
        if relieved:
            return relieved
        bounds = []
        if self.policy in ("time_and_consumed", "time"):
            bounds.append(self.time_bound(now_ms))
        if self.policy in ("time_and_consumed", "consumed"):
            bounds.append(self.consumed_bound())
        position = min(bounds)
        log.debug("retention bounds %s (policy %s)", bounds, self.policy)
        if position <= 0:
            return 0
        if position == INFINITE:  # nothing newer than the cutoff and everything consumed
            position = max((self._end_position()), 0)
        released = self.broker.store.delete_before(position)
        if released:
            self.released += released
            log.info("retention released %d (before position %d)", released, position)
        return released

    def _end_position(self) -> int:
        """One past the newest record's position: lets a store release every finished chunk."""
        end = 0
        store = self.broker.store
        for topic, queues in store.queues().items():
            for q in queues:
                lo, hi = store.queue_range(topic, q)
                if hi > lo:
                    res = store.read_queue(topic, q, hi - 1, 1, 1 << 30, None)
                    if res.count:
                        end = max(end, record.header_fields(res.records)[5] + 1)
        return end

    async def run_once(self) -> int:
        """One round on a worker thread (module docstring: why that is safe); the loop serves on.
        Cancelled (the broker stopping), it still waits for the round to end: a thread must never
        go on deleting in a store that is being closed."""
        return await run_to_end(self.clean_once)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once()
            except EQueueError as e:
                log.warning("retention check failed: %s", e)
            except Exception:
                log.exception("retention check failed")
