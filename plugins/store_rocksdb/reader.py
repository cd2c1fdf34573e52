"""RocksStoreReader: read-only access to a RocksDB store from another process (Spark).

In another process it opens a RocksDB *secondary* instance (its own small directory under the
system temp dir, removed on close) and calls TryCatchUpWithPrimary before every query, so it
follows the live broker: it sees every WriteBatch the primary has written to its WAL, whole or not
at all, so every queue range ends at a committed batch and every record below it is intact (and
still checked with its crc). With options {"mode": "read_only"} it opens a read-only instance
instead, which sees the store as it was at open and never moves on. In the broker's own process it
shares the primary instance.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from equeue_core.export import broker_address_of
from equeue_core.kv import keys, queries

from . import database
from .view import View


class RocksStoreReader:
    def __init__(self, path: str, options: dict[str, str] | None = None) -> None:
        self.path = path
        self.shared = database.acquire(path, dict(options or {}), reader=True)
        self.view = View(self.shared)
        self.address = broker_address_of(path)
        self._closed = False

    def _fresh(self) -> View:
        self.shared.catch_up()
        return self.view

    def queues(self) -> dict[str, list[int]]:
        return self._fresh().queues()

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self._fresh().queue_range(topic, queue_id)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        return self._fresh().offset_for_timestamp(topic, queue_id, ts_ms)

    def export(self, topic: str, queue_id: int, start: int, end: int, batch_rows: int = 65536,
               columns: Sequence[str] | None = None, row_filter: Any = None) -> Iterator[Any]:
        """Offsets [start, min(end, max offset now)) as RecordBatches (only `columns`, rows
        `row_filter` keeps); start below the queue's min offset raises OffsetOutOfRangeError."""
        lo, hi = self.queue_range(topic, queue_id)
        if start < lo or start > hi:
            raise queries.out_of_range(start, lo, hi)
        end = min(end, hi)
        view = self.view
        return queries.export_batches(lambda o, n, b: view.read_layout(topic, queue_id, o, n, b),
                                      start, end, batch_rows, self.address, columns, row_filter)

    def group_offsets(self) -> dict[tuple[str, str, int], int]:
        self.shared.catch_up()
        return {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                for k, v in self.shared.view["offsets"].items()}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            database.release(self.shared)
