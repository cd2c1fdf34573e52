"""RocksQueueIndex: (topic, queue, queue offset) -> INDEX_ENTRY in the `index` column family.

The message store puts entries into the same WriteBatch as the records they point to (`stage`),
so log and index never disagree, even after a crash; `add` is the standalone path the contract
offers (its own write). Queue ranges live in the `queues` column family, written in the same
batch, and are mirrored in memory for the writer's process.
"""

from __future__ import annotations

import threading

import rocksdict

from equeue_core.contracts import StoreSettings
from equeue_core.record import INDEX_ENTRY_SIZE

from . import database, keys
from .view import View


class RocksQueueIndex:
    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.shared = database.acquire(settings.data_dir, settings.options)
        self._lock = threading.Lock()
        self._closed = False
        self._ranges: dict[tuple[str, int], tuple[int, int]] = View(self.shared).ranges()

    # -- the writer (the store calls these while building its WriteBatch) ---------------------

    def stage(self, wb: rocksdict.WriteBatch, topic: str, queue_id: int, first_offset: int,
              entries: bytes | bytearray) -> tuple[int, int]:
        """Put entries and the queue's new range into wb; returns the range to `publish` after the write."""
        n = len(entries) // INDEX_ENTRY_SIZE
        prefix = keys.queue_key(topic, queue_id)
        raw = bytes(entries)
        cf = self.shared.cf["index"]
        put = wb.put
        for i in range(n):
            put(keys.index_key(prefix, first_offset + i), raw[i * INDEX_ENTRY_SIZE:(i + 1) * INDEX_ENTRY_SIZE], cf)
        lo, hi = self._ranges.get((topic, queue_id), (first_offset, first_offset))
        new = (min(lo, first_offset), max(hi, first_offset + n))
        put(prefix, keys.QUEUE_RANGE.pack(*new), self.shared.cf["queues"])
        return new

    def drop_below(self, wb: rocksdict.WriteBatch, topic: str, queue_id: int, new_min: int) -> tuple[int, int]:
        """Range-delete entries below new_min in wb (retention); returns the range to publish."""
        lo, hi = self._ranges[(topic, queue_id)]
        prefix = keys.queue_key(topic, queue_id)
        wb.delete_range(keys.index_key(prefix, lo), keys.index_key(prefix, new_min), self.shared.cf["index"])
        new = (max(lo, new_min), hi)
        wb.put(prefix, keys.QUEUE_RANGE.pack(*new), self.shared.cf["queues"])
        return new

    def publish(self, topic: str, queue_id: int, new_range: tuple[int, int]) -> None:
        self._ranges[(topic, queue_id)] = new_range

    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        new = self.stage(wb, topic, queue_id, first_offset, entries)
        self.shared.db.write(wb)
        self.publish(topic, queue_id, new)

    # -- readers ------------------------------------------------------------------------------

    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> memoryview:
        return memoryview(View(self.shared).entries(topic, queue_id, offset, max_count))

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self._ranges.get((topic, queue_id), (0, 0))

    def ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        return dict(self._ranges)

    def queues(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self._ranges):
            out.setdefault(topic, []).append(qid)
        return out

    def flush(self) -> None:
        self.shared.db.flush_wal(True)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        database.release(self.shared)
