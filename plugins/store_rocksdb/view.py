"""Reads over a RocksDB instance (primary or secondary): queue ranges, index entries, records.

There is no cross-column-family snapshot in rocksdict's API (its Snapshot has no point get), so
consistency comes from the write path instead: one WriteBatch puts a batch's records, its index
entries and the queue's new range atomically, so a visible range or entry always has its records.
Only retention can remove something between two reads, and that surfaces as
OffsetOutOfRangeError with the bounds read afterwards (queries.pull / check_record).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import rocksdict

from equeue_core.contracts import PullResult
from equeue_core.errors import MessageNotFoundError
from equeue_core.kv import chunks, keys, queries
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE

from .database import SharedDb


class View:
    def __init__(self, shared: SharedDb) -> None:
        # Column family views are looked up per call, never kept: a kept view would keep RocksDB
        # open after the last release (see database.release).
        self.shared = shared

    @property
    def log(self) -> rocksdict.Rdict:
        return self.shared.view["log"]

    @property
    def index(self) -> rocksdict.Rdict:
        return self.shared.view["index"]

    @property
    def queues_cf(self) -> rocksdict.Rdict:
        return self.shared.view["queues"]

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        v = self.queues_cf.get(keys.queue_key(topic, queue_id))
        return keys.QUEUE_RANGE.unpack(v) if v is not None else (0, 0)

    def ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        return {keys.parse_queue_key(k): keys.QUEUE_RANGE.unpack(v) for k, v in self.queues_cf.items()}

    def queues(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self.ranges()):
            out.setdefault(topic, []).append(qid)
        return out

    def entries(self, topic: str, queue_id: int, offset: int, count: int) -> bytes:
        """Packed entries for the offsets of [offset, offset + count) that exist, stopping at the
        first missing one: a floor seek to the chunk holding offset, then the chunks after it."""
        if count <= 0:
            return b""
        prefix = keys.queue_key(topic, queue_id)
        it = self.index.iter()
        it.seek_for_prev(keys.index_key(prefix, offset))
        out = []
        want = offset
        stop = offset + count
        plen = len(prefix)
        while want < stop and it.valid():
            k = it.key()
            if not k.startswith(prefix):
                break
            first = keys.QUEUE_OFFSET.unpack_from(k, plen)[0]
            v = it.value()
            n = len(v) // INDEX_ENTRY_SIZE
            if not first <= want < first + n:
                break
            take = min(first + n, stop)
            out.append(v[(want - first) * INDEX_ENTRY_SIZE:(take - first) * INDEX_ENTRY_SIZE])
            want = take
            it.next()
        return b"".join(out)

    def entry(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int]:
        raw = self.entries(topic, queue_id, offset, 1)
        if not raw:
            raise MessageNotFoundError(f"no index entry for {topic}/{queue_id}@{offset}")
        return INDEX_ENTRY.unpack(raw)

    def chunk_finder(self) -> chunks.FloorChunk:
        """floor_chunk(p): (first position, value) of the log chunk at or below p, or None; one iterator."""
        it = self.log.iter()

        def floor_chunk(p: int) -> tuple[int, bytes] | None:
            key = keys.log_key(p)
            if it.valid():  # reading on in log order: the next chunk often starts exactly at p
                it.next()
                if it.valid() and it.key() == key:
                    return p, it.value()
            it.seek_for_prev(key)
            if not it.valid():
                return None
            return keys.position_of(it.key()), it.value()

        return floor_chunk

    def records(self, positions: Sequence[int]) -> list[bytes | None]:
        """The record starting at each (ascending) position (chunks.slice_records), one iterator."""
        return chunks.slice_records(positions, self.chunk_finder())

    def record(self, position: int) -> bytes:
        return chunks.checked_record(self.records([position])[0], position)

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             tag_hashes: frozenset[int] | None, bounds: tuple[int, int] | None = None) -> PullResult:
        lo, hi = bounds if bounds is not None else self.queue_range(topic, queue_id)
        return queries.pull(lambda o, n: self.entries(topic, queue_id, o, n), self.records,
                            offset, lo, hi, max_count, max_bytes, tag_hashes, topic=topic, queue_id=queue_id)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int,
                             bounds: tuple[int, int] | None = None) -> int:
        lo, hi = bounds if bounds is not None else self.queue_range(topic, queue_id)

        def at_or_after(o: int) -> bool:
            return queries.store_ts(self.record(self.entry(topic, queue_id, o)[0])) >= ts_ms

        return queries.bisect_first(lo, hi, at_or_after)

    def read_layout(self, topic: str, queue_id: int, offset: int, count: int, max_bytes: int) -> tuple[bytes, Any]:
        """(buffer, starts) of 1..count verified records from offset on (queries.read_layout);
        OffsetOutOfRangeError if any of them is gone."""
        lo, hi = self.queue_range(topic, queue_id)
        if offset < lo or offset + count > hi:
            raise queries.out_of_range(offset if offset < lo else offset + count, lo, hi)
        raw = self.entries(topic, queue_id, offset, count)
        if len(raw) != count * INDEX_ENTRY_SIZE:
            raise queries.out_of_range(offset, *self.queue_range(topic, queue_id))
        return queries.read_layout(raw, self.chunk_finder(), offset, lo, hi, max_bytes,
                                   topic=topic, queue_id=queue_id)
