"""Reads over one LMDB read transaction: a consistent snapshot of log, index and queue ranges.

The store (in the broker) and the reader (in any other process) both read through this, so a
reader sees exactly what a pull would: a prefix of each queue ending at a committed batch.
Read transactions are opened with buffers=True: values are memoryviews into LMDB's map, so a
record is copied once, when the answer is built, and never before; nothing may keep such a view
past its transaction (read_layout and record return bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lmdb

from equeue_core.contracts import PullResult
from equeue_core.errors import MessageNotFoundError
from equeue_core.kv import chunks, keys, queries
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE

from .environment import SharedEnv


def floor(cur: lmdb.Cursor, key: bytes, prefix: bytes = b"") -> bool:
    """Put cur on the greatest key <= key that starts with prefix; False if there is none."""
    if cur.set_range(key):
        if bytes(cur.key()) != key and not cur.prev():
            return False
    elif not cur.last():
        return False
    return bytes(cur.key()).startswith(prefix)


class Snapshot:
    def __init__(self, shared: SharedEnv, txn: lmdb.Transaction) -> None:
        self.txn = txn
        self.log_db = shared.db(b"log")
        self.index_db = shared.db(b"index")
        self.queues_db = shared.db(b"queues")

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        v = self.txn.get(keys.queue_key(topic, queue_id), db=self.queues_db)
        return keys.QUEUE_RANGE.unpack(v) if v is not None else (0, 0)

    def ranges(self) -> dict[tuple[str, int], tuple[int, int]]:
        return {keys.parse_queue_key(k): keys.QUEUE_RANGE.unpack(v)
                for k, v in self.txn.cursor(self.queues_db)}

    def queues(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self.ranges()):
            out.setdefault(topic, []).append(qid)
        return out

    def entries(self, topic: str, queue_id: int, offset: int, count: int) -> bytes:
        """Packed entries for the offsets of [offset, offset + count) that exist, stopping at the
        first missing one: a floor seek to the chunk holding offset, then the chunks after it."""
        prefix = keys.queue_key(topic, queue_id)
        cur = self.txn.cursor(self.index_db)
        if count <= 0 or not floor(cur, keys.index_key(prefix, offset), prefix):
            return b""
        out = []
        want = offset
        stop = offset + count
        plen = len(prefix)
        while want < stop:
            k = bytes(cur.key())
            if not k.startswith(prefix):
                break
            first = keys.QUEUE_OFFSET.unpack_from(k, plen)[0]
            v = cur.value()
            n = len(v) // INDEX_ENTRY_SIZE
            if not first <= want < first + n:
                break
            take = min(first + n, stop)
            out.append(bytes(v[(want - first) * INDEX_ENTRY_SIZE:(take - first) * INDEX_ENTRY_SIZE]))
            want = take
            if not cur.next():
                break
        return b"".join(out)

    def entry(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int]:
        raw = self.entries(topic, queue_id, offset, 1)
        if not raw:
            raise MessageNotFoundError(f"no index entry for {topic}/{queue_id}@{offset}")
        return INDEX_ENTRY.unpack(raw)

    def chunk_finder(self) -> chunks.FloorChunk:
        """floor_chunk(p): (first position, value) of the log chunk at or below p, or None; one cursor."""
        cur = self.txn.cursor(self.log_db)

        def floor_chunk(p: int) -> tuple[int, memoryview | bytes] | None:
            if not floor(cur, keys.log_key(p)):
                return None
            return keys.position_of(cur.key()), cur.value()

        return floor_chunk

    def records(self, positions: Sequence[int]) -> list[memoryview | bytes | None]:
        """The record starting at each (ascending) position (chunks.slice_records), one cursor."""
        return chunks.slice_records(positions, self.chunk_finder())

    def record(self, position: int) -> bytes:
        return chunks.checked_record(self.records([position])[0], position)

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             tag_hashes: frozenset[int] | None) -> PullResult:
        lo, hi = self.queue_range(topic, queue_id)
        return queries.pull(lambda o, n: self.entries(topic, queue_id, o, n), self.records,
                            offset, lo, hi, max_count, max_bytes, tag_hashes, topic=topic, queue_id=queue_id)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        lo, hi = self.queue_range(topic, queue_id)

        def at_or_after(o: int) -> bool:
            return queries.store_ts(self.record(self.entry(topic, queue_id, o)[0])) >= ts_ms

        return queries.bisect_first(lo, hi, at_or_after)

    def read_layout(self, topic: str, queue_id: int, offset: int, count: int, max_bytes: int) -> tuple[bytes, Any]:
        """(buffer, starts) of 1..count verified records from offset on, copied out of this
        transaction (queries.read_layout); OffsetOutOfRangeError if any of them is gone."""
        lo, hi = self.queue_range(topic, queue_id)
        if offset < lo or offset + count > hi:
            raise queries.out_of_range(offset if offset < lo else offset + count, lo, hi)
        raw = self.entries(topic, queue_id, offset, count)
        if len(raw) != count * INDEX_ENTRY_SIZE:
            raise queries.out_of_range(offset, lo, hi)
        return queries.read_layout(raw, self.chunk_finder(), offset, lo, hi, max_bytes,
                                   topic=topic, queue_id=queue_id)
