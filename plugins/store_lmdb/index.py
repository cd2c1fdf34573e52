"""LmdbQueueIndex: (topic, queue, queue offset) -> INDEX_ENTRY in the `index` database.

The message store writes entries in the same write transaction as the records they point to
(`stage`), so log and index never disagree, even after a crash; `add` is the standalone path the
contract offers (its own transaction). Queue ranges live in the `queues` database, updated in the
same transaction, and are mirrored in memory for the writer's process.
"""

from __future__ import annotations

import threading

import lmdb

from equeue_core.contracts import StoreSettings
from equeue_core.record import INDEX_ENTRY_SIZE

from . import environment, keys
from .snapshot import Snapshot


class LmdbQueueIndex:
    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.shared = environment.acquire(settings.data_dir, settings.options)
        self.env = self.shared.env
        self.index_db = self.shared.db(b"index")
        self.queues_db = self.shared.db(b"queues")
        self._lock = threading.Lock()
        self._closed = False
        with self.env.begin() as txn:
            self._ranges: dict[tuple[str, int], tuple[int, int]] = Snapshot(self.shared, txn).ranges()

    # -- the writer (the store calls these inside its own write txn) ---------------------------

    def stage(self, txn: lmdb.Transaction, topic: str, queue_id: int, first_offset: int,
              entries: bytes | bytearray) -> tuple[int, int]:
        """Write entries and the queue's new range in txn; returns the range to `publish` after commit."""
        n = len(entries) // INDEX_ENTRY_SIZE
        prefix = keys.queue_key(topic, queue_id)
        mv = memoryview(entries)
        items = [(keys.index_key(prefix, first_offset + i), mv[i * INDEX_ENTRY_SIZE:(i + 1) * INDEX_ENTRY_SIZE])
                 for i in range(n)]
        txn.cursor(self.index_db).putmulti(items)
        lo, hi = self._ranges.get((topic, queue_id), (first_offset, first_offset))
        new = (min(lo, first_offset), max(hi, first_offset + n))
        txn.put(prefix, keys.QUEUE_RANGE.pack(*new), db=self.queues_db)
        return new

    def drop_below(self, txn: lmdb.Transaction, topic: str, queue_id: int, new_min: int) -> tuple[int, int]:
        """Delete entries below new_min in txn (retention); returns the range to publish."""
        lo, hi = self._ranges[(topic, queue_id)]
        prefix = keys.queue_key(topic, queue_id)
        end = keys.index_key(prefix, new_min)
        cur = txn.cursor(self.index_db)
        if cur.set_range(keys.index_key(prefix, lo)):
            while cur.key() and cur.key() < end:
                cur.delete()
        new = (max(lo, new_min), hi)
        txn.put(prefix, keys.QUEUE_RANGE.pack(*new), db=self.queues_db)
        return new

    def publish(self, topic: str, queue_id: int, new_range: tuple[int, int]) -> None:
        self._ranges[(topic, queue_id)] = new_range

    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None:
        with self.env.begin(write=True) as txn:
            new = self.stage(txn, topic, queue_id, first_offset, entries)
        self.publish(topic, queue_id, new)

    # -- readers ------------------------------------------------------------------------------

    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> memoryview:
        with self.env.begin() as txn:
            return memoryview(Snapshot(self.shared, txn).entries(topic, queue_id, offset, max_count))

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
        self.env.sync(True)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        environment.release(self.shared)
