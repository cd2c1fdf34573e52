"""LmdbStoreReader: read-only access to a live LMDB store from another process (Spark).

LMDB is built for this: any number of processes open the environment read-only and each read
transaction is a consistent snapshot of the last commit, taken without blocking the writer. So
every queue range a reader sees ends at a committed batch and every record below it is intact
(and still checked with its crc). Each call below starts a fresh snapshot and so follows the
writer; an export reads each batch of rows in one snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from equeue_core.export import broker_address_of
from equeue_core.kv import keys, queries

from . import environment
from .snapshot import Snapshot


class LmdbStoreReader:
    def __init__(self, path: str, options: dict[str, str] | None = None) -> None:
        self.path = path
        self.shared = environment.acquire(path, dict(options or {}), readonly=True)
        self.env = self.shared.env
        self.address = broker_address_of(path)
        self._closed = False


    def queues(self) -> dict[str, list[int]]:
        with self.env.begin(buffers=True) as txn:
            return Snapshot(self.shared, txn).queues()

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        with self.env.begin(buffers=True) as txn:
            return Snapshot(self.shared, txn).queue_range(topic, queue_id)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        with self.env.begin(buffers=True) as txn:
            return Snapshot(self.shared, txn).offset_for_timestamp(topic, queue_id, ts_ms)

    def export(self, topic: str, queue_id: int, start: int, end: int, batch_rows: int = 65536,
               columns: Sequence[str] | None = None, row_filter: Any = None) -> Iterator[Any]:
        """Offsets [start, min(end, max offset now)) as RecordBatches (only `columns`, rows
        `row_filter` keeps); start below the queue's min offset raises OffsetOutOfRangeError."""
        lo, hi = self.queue_range(topic, queue_id)
        if start < lo or start > hi:
            raise queries.out_of_range(start, lo, hi)
        end = min(end, hi)

        def read_layout(offset: int, count: int, max_bytes: int) -> tuple[bytes, Any]:
            with self.env.begin(buffers=True) as txn:
                return Snapshot(self.shared, txn).read_layout(topic, queue_id, offset, count, max_bytes)

        return queries.export_batches(read_layout, start, end, batch_rows, self.address, columns, row_filter)

    def group_offsets(self) -> dict[tuple[str, str, int], int]:
        with self.env.begin(buffers=True) as txn:
            return {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                    for k, v in txn.cursor(self.shared.db(b"offsets"))}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            environment.release(self.shared)
