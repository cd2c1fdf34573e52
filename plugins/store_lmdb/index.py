"""LmdbQueueIndex: (topic, queue, queue offset) -> INDEX_ENTRY in the `index` database.

Entries are stored one value per chunk (equeue_core/kv/chunks.py): key = queue + the chunk's first queue offset,
value = its packed entries; an offset is found by a floor seek. The message store writes them in
the same write transaction as the records they point to (`stage`), so log and index never disagree, even after a crash; `add` is the standalone path the
contract offers (its own transaction). Queue ranges live in the `queues` database, updated in the
same transaction, and are mirrored in memory for the writer's process.
"""

from __future__ import annotations

import lmdb

from equeue_core.kv import keys
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE

from .environment import SharedEnv
from .snapshot import Snapshot, floor


class LmdbQueueIndex:
    """Opened by the engine on its environment; the environment outlives it."""

    def __init__(self, shared: SharedEnv) -> None:
        self.shared = shared
        self.env = shared.env
        self.index_db = shared.db(b"index")
        self.queues_db = shared.db(b"queues")
        with self.env.begin(buffers=True) as txn:
            self._ranges: dict[tuple[str, int], tuple[int, int]] = Snapshot(self.shared, txn).ranges()

    # -- the writer (the store calls these inside its own write txn) ---------------------------

    def stage(self, txn: lmdb.Transaction, topic: str, queue_id: int,
              chunks: list[tuple[int, bytes | bytearray | memoryview]]) -> tuple[int, int]:
        """Put one index value per chunk, (first queue offset, packed entries), and the queue's new
        range in txn; returns the range to `publish` after the commit."""
        prefix = keys.queue_key(topic, queue_id)
        txn.cursor(self.index_db).putmulti([(keys.index_key(prefix, first), entries) for first, entries in chunks])
        first = chunks[0][0]
        last_first, last_entries = chunks[-1]
        lo, hi = self._ranges.get((topic, queue_id), (first, first))
        new = (min(lo, first), max(hi, last_first + len(last_entries) // INDEX_ENTRY_SIZE))
        txn.put(prefix, keys.QUEUE_RANGE.pack(*new), db=self.queues_db)
        return new

    def drop_below(self, txn: lmdb.Transaction, topic: str, queue_id: int, position: int) -> tuple[int, int] | None:
        """Retention: delete the index chunks whose records lie below position (the first kept log
        chunk, so whole chunks go on both sides); returns the range to publish, None if unchanged."""
        lo, hi = self._ranges[(topic, queue_id)]
        prefix = keys.queue_key(topic, queue_id)
        cur = txn.cursor(self.index_db)
        new_lo = lo
        if floor(cur, keys.index_key(prefix, lo), prefix):
            while cur.key() and bytes(cur.key()).startswith(prefix):
                v = cur.value()
                if INDEX_ENTRY.unpack_from(v, 0)[0] >= position:
                    break
                new_lo = keys.QUEUE_OFFSET.unpack_from(bytes(cur.key()), len(prefix))[0] + len(v) // INDEX_ENTRY_SIZE
                cur.delete()
        if new_lo == lo:
            return None
        new = (new_lo, hi)
        txn.put(prefix, keys.QUEUE_RANGE.pack(*new), db=self.queues_db)
        return new

    def publish(self, topic: str, queue_id: int, new_range: tuple[int, int]) -> None:
        self._ranges[(topic, queue_id)] = new_range

    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None:
        with self.env.begin(write=True) as txn:
            new = self.stage(txn, topic, queue_id, [(first_offset, entries)])
        self.publish(topic, queue_id, new)

    # -- readers ------------------------------------------------------------------------------

    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> memoryview:
        with self.env.begin(buffers=True) as txn:
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
