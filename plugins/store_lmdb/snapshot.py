"""Reads over one LMDB read transaction: a consistent snapshot of log, index and queue ranges.

The store (in the broker) and the reader (in any other process) both read through this, so a
reader sees exactly what a pull would: a prefix of each queue ending at a committed batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import lmdb

from equeue_core.contracts import PullResult
from equeue_core.errors import MessageNotFoundError
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE, verify

from . import keys, queries
from .environment import SharedEnv


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
        """Packed entries for the offsets of [offset, offset + count) that exist, in order."""
        if count <= 0:
            return b""
        prefix = keys.queue_key(topic, queue_id)
        end = keys.index_key(prefix, offset + count)
        cur = self.txn.cursor(self.index_db)
        if not cur.set_range(keys.index_key(prefix, offset)):
            return b""
        out = []
        for k, v in cur:
            if k >= end:
                break
            out.append(v)
        return b"".join(out)

    def entry(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int]:
        v = self.txn.get(keys.index_key(keys.queue_key(topic, queue_id), offset), db=self.index_db)
        if v is None:
            raise MessageNotFoundError(f"no index entry for {topic}/{queue_id}@{offset}")
        return INDEX_ENTRY.unpack(v)

    def records(self, positions: Sequence[int]) -> list[bytes | None]:
        get = self.txn.get
        db = self.log_db
        pack = keys.POSITION.pack
        return [get(pack(p), db=db) for p in positions]

    def record(self, position: int) -> bytes:
        rec = self.txn.get(keys.log_key(position), db=self.log_db)
        if rec is None:
            raise MessageNotFoundError(f"no record at position {position}")
        verify(rec)
        return rec

    def pull(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             tag_hashes: frozenset[int] | None) -> PullResult:
        lo, hi = self.queue_range(topic, queue_id)
        return queries.pull(lambda o, n: self.entries(topic, queue_id, o, n), self.records,
                            offset, lo, hi, max_count, max_bytes, tag_hashes)

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        lo, hi = self.queue_range(topic, queue_id)

        def at_or_after(o: int) -> bool:
            return queries.store_ts(self.record(self.entry(topic, queue_id, o)[0])) >= ts_ms

        return queries.bisect_first(lo, hi, at_or_after)

    def read_chunk(self, topic: str, queue_id: int, offset: int, count: int) -> list[bytes]:
        """Exactly count verified records from offset on (OffsetOutOfRangeError if any is gone)."""
        lo, hi = self.queue_range(topic, queue_id)
        if offset < lo or offset + count > hi:
            raise queries.out_of_range(offset if offset < lo else offset + count, lo, hi)
        raw = self.entries(topic, queue_id, offset, count)
        if len(raw) != count * INDEX_ENTRY_SIZE:
            raise queries.out_of_range(offset, lo, hi)
        ents = [INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY_SIZE) for i in range(count)]
        recs = self.records([e[0] for e in ents])
        return [queries.check_record(r, offset + i, e[1], lo, hi) for i, (e, r) in enumerate(zip(ents, recs, strict=True))]
