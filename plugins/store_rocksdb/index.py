"""RocksQueueIndex: (topic, queue, queue offset) -> INDEX_ENTRY in the `index` column family.

Entries are stored one value per chunk (equeue_core/kv/chunks.py): key = queue + the chunk's first queue offset,
value = its packed entries; an offset is found by a floor seek (SeekForPrev). The message store
puts them into the same WriteBatch as the records they point to (`stage`),
so log and index never disagree, even after a crash; `add` is the standalone path the contract
offers (its own write). Queue ranges live in the `queues` column family, written in the same
batch, and are mirrored in memory for the writer's process.
"""

from __future__ import annotations

import rocksdict

from equeue_core.kv import keys
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE

from .database import SharedDb
from .view import View


class RocksQueueIndex:
    """Opened by the engine on its database; the database outlives it."""

    def __init__(self, shared: SharedDb) -> None:
        self.shared = shared
        self._ranges: dict[tuple[str, int], tuple[int, int]] = View(self.shared).ranges()

    # -- the writer (the store calls these while building its WriteBatch) ---------------------

    def stage(self, wb: rocksdict.WriteBatch, topic: str, queue_id: int,
              chunks: list[tuple[int, bytes]]) -> tuple[int, int]:
        """Put one index value per chunk, (first queue offset, packed entries), and the queue's new
        range into wb; returns the range to `publish` after the write."""
        prefix = keys.queue_key(topic, queue_id)
        cf = self.shared.cf["index"]
        for first, entries in chunks:
            wb.put(keys.index_key(prefix, first), entries, cf)
        first = chunks[0][0]
        last_first, last_entries = chunks[-1]
        lo, hi = self._ranges.get((topic, queue_id), (first, first))
        new = (min(lo, first), max(hi, last_first + len(last_entries) // INDEX_ENTRY_SIZE))
        wb.put(prefix, keys.QUEUE_RANGE.pack(*new), self.shared.cf["queues"])
        return new

    def drop_below(self, wb: rocksdict.WriteBatch, topic: str, queue_id: int, position: int) -> tuple[int, int] | None:
        """Retention: range-delete the index chunks whose records lie below position (the first
        kept log chunk, so whole chunks go on both sides); returns the range to publish, None if
        unchanged."""
        lo, hi = self._ranges[(topic, queue_id)]
        prefix = keys.queue_key(topic, queue_id)
        it = self.shared.view["index"].iter()
        it.seek_for_prev(keys.index_key(prefix, lo))  # the chunk holding lo ...
        if not (it.valid() and it.key().startswith(prefix)):
            it.seek(keys.index_key(prefix, lo))  # ... or, if none, the first chunk after it
        new_lo = lo
        while it.valid() and it.key().startswith(prefix):
            v = it.value()
            if INDEX_ENTRY.unpack_from(v, 0)[0] >= position:
                break
            new_lo = keys.QUEUE_OFFSET.unpack_from(it.key(), len(prefix))[0] + len(v) // INDEX_ENTRY_SIZE
            it.next()
        del it
        if new_lo == lo:
            return None
        wb.delete_range(prefix, keys.index_key(prefix, new_lo), self.shared.cf["index"])
        new = (new_lo, hi)
        wb.put(prefix, keys.QUEUE_RANGE.pack(*new), self.shared.cf["queues"])
        return new

    def publish(self, topic: str, queue_id: int, new_range: tuple[int, int]) -> None:
        self._ranges[(topic, queue_id)] = new_range

    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        new = self.stage(wb, topic, queue_id, [(first_offset, bytes(entries))])
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
