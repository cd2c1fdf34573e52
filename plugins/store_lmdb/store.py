"""LmdbMessageStore: the commit log as an LMDB database keyed by a global record sequence.

Guarantees:
- One write transaction per append: the records, their index entries, the queue's new range and
  the next position commit together or not at all, so a crash never leaves a torn record or an
  index entry without its record (LMDB's copy-on-write B+tree keeps the last committed state).
- Commits do not fsync (the environment is opened with sync=False, so a SIGKILL loses nothing
  committed: the pages are in the OS page cache). Durability against power loss comes from the
  Flusher thread calling env.sync: every `interval` in async mode, as soon as anyone waits in sync
  mode (group commit). wait_flushed(end) resolves only after an env.sync that started after the
  commit of end. Caveat from LMDB's docs for MDB_NOSYNC: after an OS crash (not a process crash)
  commits after the last env.sync may be lost, and on a file system that reorders writes the
  environment can be damaged; set store_options.lmdb.commit_sync = true to fsync inside every
  commit instead (slower, and the fsync then runs on the writer's thread).
- Position = the record's sequence number (0, 1, 2 ...), never reused; end_position = last + 1.
"""

from __future__ import annotations

import concurrent.futures
import struct
import threading
from collections.abc import Sequence

import lmdb

from equeue_core.contracts import AppendResult, PullResult, QueueIndex, RecoveryReport, StoreSettings
from equeue_core.errors import CorruptRecordError, PluginError, StoreError
from equeue_core.flush import Flusher
from equeue_core.record import index_entries, now_ms, stamp_batch

from . import environment, keys, queries
from .index import LmdbQueueIndex
from .snapshot import Snapshot

_U32 = struct.Struct("<I")


class LmdbMessageStore:
    def __init__(self, settings: StoreSettings, index: QueueIndex) -> None:
        if not isinstance(index, LmdbQueueIndex):
            raise PluginError(f"the lmdb message store needs the lmdb queue index, not {type(index).__name__}")
        self.settings = settings
        self.index = index
        self.shared = environment.acquire(settings.data_dir, settings.options)
        self.env = self.shared.env
        self.log_db = self.shared.db(b"log")
        self.state_db = self.shared.db(b"state")
        self.commit_sync = bool(settings.options.get("commit_sync", False))
        self.flusher = Flusher(self._sync, settings.flush, settings.flush_interval_ms, name="equeue-lmdb-flusher")
        self._next = 0
        self._min = 0
        self._opened = False
        self._closed = False
        self._close_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Nothing to truncate (commits are atomic); checks the newest record of every queue and
        reports whether the last stop was clean."""
        with self.env.begin(write=True) as txn:
            state = {k: bytes(v) for k, v in txn.cursor(self.state_db)}
            txn.put(keys.CLEAN, b"\x00", db=self.state_db)
        self.env.sync(True)
        fresh = keys.NEXT_POSITION not in state
        self._next = keys.U64_VALUE.unpack(state[keys.NEXT_POSITION])[0] if not fresh else 0
        self._min = keys.U64_VALUE.unpack(state[keys.MIN_POSITION])[0] if keys.MIN_POSITION in state else 0
        clean = fresh or state.get(keys.CLEAN) == b"\x01"
        notes = ["new store"] if fresh else []
        with self.env.begin() as txn:
            snap = Snapshot(self.shared, txn)
            for (topic, qid), (lo, hi) in self.index.ranges().items():
                if hi > lo:
                    pos, size, _ = snap.entry(topic, qid, hi - 1)
                    try:
                        queries.check_record(snap.records([pos])[0], hi - 1, size, lo, hi)
                    except CorruptRecordError as e:
                        raise StoreError(f"{topic}/{qid}: newest record is damaged ({e}); the LMDB file "
                                         f"is corrupt, restore it from a copy") from e
        if not clean:
            notes.append("unclean stop: LMDB commits are atomic, nothing to truncate or rebuild")
        self.flusher.start(self._next)
        self._opened = True
        return RecoveryReport(clean=clean, records=self._next - self._min, notes=notes)

    def _sync(self) -> int:
        end = self._next
        self.env.sync(True)
        return end

    def flush(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._opened:
            self.flusher.stop()
            with self.env.begin(write=True) as txn:
                txn.put(keys.CLEAN, b"\x01", db=self.state_db)
        environment.release(self.shared)

    # -- writer ---------------------------------------------------------------------------------

    def append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        """One write transaction for the whole batch: records, index entries, queue range."""
        first_offset = self.index.queue_range(topic, queue_id)[1]
        n = len(starts)
        if n == 0:
            return AppendResult(first_offset, [], self._next)
        first = self._next
        positions = list(range(first, first + n))
        stamp_batch(batch, starts, positions, first_offset, queue_id, now_ms())
        entries = index_entries(batch, starts, positions)
        mv = memoryview(batch)
        size_of = _U32.unpack_from
        pack = keys.POSITION.pack
        items = [(pack(p), mv[s:s + size_of(batch, s)[0]]) for s, p in zip(starts, positions, strict=True)]
        end = first + n
        try:
            with self.env.begin(write=True) as txn:
                txn.cursor(self.log_db).putmulti(items, append=True)
                new_range = self.index.stage(txn, topic, queue_id, first_offset, entries)
                txn.put(keys.NEXT_POSITION, keys.U64_VALUE.pack(end), db=self.state_db)
        except lmdb.MapFullError as e:
            raise StoreError("LMDB map is full: raise store_options.lmdb.map_size") from e
        except lmdb.Error as e:
            raise StoreError(f"LMDB append failed: {e}") from e
        if self.commit_sync:
            self.env.sync(True)
        self._next = end
        self.index.publish(topic, queue_id, new_range)
        self.flusher.written(end)
        return AppendResult(first_offset, positions, end)

    def wait_flushed(self, end_position: int) -> concurrent.futures.Future:
        return self.flusher.wait(end_position)

    def delete_before(self, position: int) -> int:
        """Delete every record below position and its index entries, in one transaction.
        Returns the number of records released; the file keeps its size (LMDB reuses the pages)."""
        position = min(position, self._next)
        if position <= self._min:
            return 0
        published = []
        with self.env.begin(write=True) as txn:
            snap = Snapshot(self.shared, txn)
            for (topic, qid), (lo, hi) in self.index.ranges().items():
                boundary = queries.bisect_first(lo, hi, lambda o, t=topic, q=qid: snap.entry(t, q, o)[0] >= position)
                if boundary > lo:
                    published.append((topic, qid, self.index.drop_below(txn, topic, qid, boundary)))
            cur = txn.cursor(self.log_db)
            limit = keys.log_key(position)
            if cur.first():
                while cur.key() and cur.key() < limit:
                    cur.delete()
            txn.put(keys.MIN_POSITION, keys.U64_VALUE.pack(position), db=self.state_db)
        for topic, qid, new_range in published:
            self.index.publish(topic, qid, new_range)
        released = position - self._min
        self._min = position
        return released

    # -- reads (any thread) ---------------------------------------------------------------------

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
                   tag_hashes: frozenset[int] | None = None) -> PullResult:
        with self.env.begin() as txn:
            return Snapshot(self.shared, txn).pull(topic, queue_id, offset, max_count, max_bytes, tag_hashes)

    def read_position(self, position: int) -> bytes:
        with self.env.begin() as txn:
            return Snapshot(self.shared, txn).record(position)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self.index.queue_range(topic, queue_id)

    def queues(self) -> dict[str, list[int]]:
        return self.index.queues()

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        with self.env.begin() as txn:
            return Snapshot(self.shared, txn).offset_for_timestamp(topic, queue_id, ts_ms)
