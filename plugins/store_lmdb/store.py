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
- Records are stored in chunks (equeue_core/kv/chunks.py): one log value and one index value per chunk, so an
  append costs a few puts, not two per record. Position = the record's byte offset in this virtual
  log, never reused; end_position = one past the batch's last byte.
"""

from __future__ import annotations

import concurrent.futures
import struct
import threading
from collections.abc import Sequence

import lmdb

from equeue_core.contracts import AppendResult, PullResult, RecoveryReport, StoreSettings
from equeue_core.errors import CorruptRecordError, StoreError
from equeue_core.flush import Flusher
from equeue_core.kv import chunks, keys, queries
from equeue_core.kv import replica_log as replica
from equeue_core.record import header_fields, now_ms

from .environment import SharedEnv
from .index import LmdbQueueIndex
from .replica_ops import LmdbOps
from .snapshot import Snapshot

_U32 = struct.Struct("<I")


class LmdbMessageStore:
    """Opened by LmdbEngine on its environment, with its index; the environment outlives both.

    `_write_lock` serializes the two writers of the log's bookkeeping: append (the broker's
    event loop) and delete_before (retention, on a worker thread). LMDB serializes their write
    transactions anyway; the lock also keeps each one's read-modify-write of the in-memory next
    position and queue ranges whole, so retention never publishes a range computed before an
    append committed (which would hide that append's records)."""

    def __init__(self, settings: StoreSettings, shared: SharedEnv, index: LmdbQueueIndex) -> None:
        self.settings = settings
        self.index = index
        self.shared = shared
        self.env = shared.env
        self.log_db = shared.db(b"log")
        self.state_db = shared.db(b"state")
        self.commit_sync = bool(settings.options.get("commit_sync", False))
        self.chunk_bytes = int(settings.options.get("chunk_bytes", chunks.DEFAULT_CHUNK_BYTES))
        self.flusher = Flusher(self._sync, settings.flush, settings.flush_interval_ms, name="equeue-lmdb-flusher")
        self._next = 0
        self._min = 0
        self._last_ts = 0  # newest store time given out: store times never go backwards
        self._write_lock = threading.Lock()
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
        with self.env.begin(buffers=True) as txn:
            snap = Snapshot(self.shared, txn)
            for (topic, qid), (lo, hi) in self.index.ranges().items():
                if hi > lo:
                    pos, size, _ = snap.entry(topic, qid, hi - 1)
                    try:
                        newest = queries.check_record(snap.records([pos])[0], hi - 1, size, pos, lo, hi,
                                                      topic=topic, queue_id=qid)
                    except CorruptRecordError as e:
                        raise StoreError(f"{topic}/{qid}: newest record is damaged ({e}); the LMDB file "
                                         f"is corrupt, restore it from a copy") from e
                    self._last_ts = max(self._last_ts, header_fields(newest)[10])
        if not clean:
            notes.append("unclean stop: LMDB commits are atomic, nothing to truncate or rebuild")
        self.flusher.start(self._next)
        self._opened = True
        records = sum(hi - lo for lo, hi in self.index.ranges().values())
        return RecoveryReport(clean=clean, records=records, notes=notes)

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

    # -- writer ---------------------------------------------------------------------------------

    def append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        """One write transaction for the whole batch: its chunks of records, their index entries,
        the queue's range and the next position."""
        with self._write_lock:
            return self._append(topic, queue_id, batch, starts)

    def _append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        first_offset = self.index.queue_range(topic, queue_id)[1]
        if not starts:
            return AppendResult(first_offset, [], self._next)
        self._last_ts = max(self._last_ts, now_ms())
        stamped = chunks.stamp_chunks(batch, starts, self._next, first_offset, queue_id, self._last_ts,
                                      self.chunk_bytes)
        end = stamped.end
        try:
            with self.env.begin(write=True) as txn:
                txn.cursor(self.log_db).putmulti(stamped.log_chunks, append=True)
                new_range = self.index.stage(txn, topic, queue_id, stamped.index_chunks)
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
        return AppendResult(first_offset, stamped.positions, end)

    def wait_flushed(self, end_position: int) -> concurrent.futures.Future:
        return self.flusher.wait(end_position)

    def delete_before(self, position: int) -> int:
        """Delete every chunk that lies wholly below position, with its index entries, in one
        transaction (a chunk holding position stays whole). Returns the bytes of records released;
        the file keeps its size (LMDB reuses the freed pages: see reusable_bytes).

        Safe beside append on another thread: both hold `_write_lock` (class docstring), and
        readers see either the state before the transaction or after it (LMDB snapshots)."""
        with self._write_lock:
            return self._delete_before(position)

    def _delete_before(self, position: int) -> int:
        position = min(position, self._next)
        published = []
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(self.log_db)
            first_kept = self._next
            if cur.first():
                while cur.key():
                    start = keys.position_of(cur.key())
                    if start + len(cur.value()) > position:
                        first_kept = start
                        break
                    cur.delete()
            if first_kept <= self._min:
                return 0
            for (topic, qid) in self.index.ranges():
                new_range = self.index.drop_below(txn, topic, qid, first_kept)
                if new_range is not None:
                    published.append((topic, qid, new_range))
            txn.put(keys.MIN_POSITION, keys.U64_VALUE.pack(first_kept), db=self.state_db)
        for topic, qid, new_range in published:
            self.index.publish(topic, qid, new_range)
        released = first_kept - self._min
        self._min = first_kept
        return released

    def reusable_bytes(self) -> int:
        """Pages inside data.mdb that no database uses (freed by deletes, reused before the file
        grows): the file's pages minus every database's branch, leaf and overflow pages."""
        with self.env.begin() as txn:
            stats = [txn.stat(db) for db in self.shared.dbs.values()]
        stats.append(self.env.stat())
        used = sum(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats)
        pages = self.env.info()["last_pgno"] + 1
        return max(0, pages - used - 2) * stats[-1]["psize"]  # 2: LMDB's meta pages

    # -- replication (contracts.ReplicaLog; equeue_core/kv/replica_log.py) -----------------------

    def end_position(self) -> int:
        return self._next

    def start_position(self) -> int:
        return min(self._min, self._next)

    def read_log(self, position: int, max_bytes: int) -> bytes:
        end = self._next
        with self.env.begin(buffers=True) as txn:
            return replica.read_log(LmdbOps(self.shared, txn), position, max_bytes, end)

    def append_log(self, position: int, data: bytes | bytearray | memoryview) -> int:
        """One write transaction: the copied records, their index entries, ranges, next position."""
        with self._write_lock:
            try:
                with self.env.begin(write=True) as txn:
                    copied, ranges = replica.stage_append(LmdbOps(self.shared, txn), position, self._next,
                                                          data, self.index.ranges(), self.chunk_bytes)
            except lmdb.MapFullError as e:
                raise StoreError("LMDB map is full: raise store_options.lmdb.map_size") from e
            except lmdb.Error as e:
                raise StoreError(f"LMDB append failed: {e}") from e
            if self.commit_sync:
                self.env.sync(True)
            self._next = copied.end
            self._last_ts = max(self._last_ts, copied.last_store_ts)
            for (topic, qid), new_range in ranges.items():
                self.index.publish(topic, qid, new_range)
            self.flusher.written(copied.end)
            return copied.end

    def truncate_log(self, position: int) -> None:
        """One write transaction, synced before returning."""
        with self._write_lock:
            if position == self._next:
                return
            with self.env.begin(write=True) as txn:
                ranges = replica.stage_truncate(LmdbOps(self.shared, txn), position, self._next, self._min,
                                                self.index.ranges())
            self.env.sync(True)
            self._next = position
            for (topic, qid), new_range in ranges.items():
                self.index.publish(topic, qid, new_range)
            self.flusher.flushed = min(self.flusher.flushed, position)
            self.flusher.written(position)

    # -- reads (any thread) ---------------------------------------------------------------------

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
                   tag_hashes: frozenset[int] | None = None) -> PullResult:
        with self.env.begin(buffers=True) as txn:
            return Snapshot(self.shared, txn).pull(topic, queue_id, offset, max_count, max_bytes, tag_hashes)

    def read_position(self, position: int) -> bytes:
        with self.env.begin(buffers=True) as txn:
            return Snapshot(self.shared, txn).record(position)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self.index.queue_range(topic, queue_id)

    def queues(self) -> dict[str, list[int]]:
        return self.index.queues()

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        with self.env.begin(buffers=True) as txn:
            return Snapshot(self.shared, txn).offset_for_timestamp(topic, queue_id, ts_ms)
