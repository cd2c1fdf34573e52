"""RocksMessageStore: the commit log as the `log` column family keyed by a global record sequence.

Guarantees:
- One WriteBatch per append: the records, their index entries, the queue's new range and the next
  position are one WAL record, applied all or nothing; after a crash RocksDB replays the WAL up to
  the last intact batch, so a torn record is never visible.
- Writes go to the WAL without fsync (WriteOptions.sync = False): the WAL bytes are in the OS page
  cache when append returns, so a SIGKILL loses nothing appended. The Flusher thread makes them
  durable against power loss with FlushWAL(sync=true): every interval in async mode, as soon as
  anyone waits in sync mode (group commit), and wait_flushed(end) resolves only after a WAL sync
  that started after end was written. store_options.rocksdb.commit_sync = true syncs every write
  instead (slower; the fsync then runs on the writer's thread).
- Records are stored in chunks (equeue_core/kv/chunks.py): one log value and one index value per chunk, so an
  append costs a few puts, not two per record. Position = the record's byte offset in this virtual
  log, never reused; end_position = one past the batch's last byte.
- Retention is a range delete (cheap, whatever the count) followed by a compaction of the deleted
  key range of the log, so disk space comes back at once.
"""

from __future__ import annotations

import concurrent.futures
import struct
import threading
from collections.abc import Sequence

import rocksdict

from equeue_core.contracts import AppendResult, PullResult, RecoveryReport, StoreSettings
from equeue_core.errors import CorruptRecordError, StoreError
from equeue_core.flush import Flusher
from equeue_core.kv import chunks, keys, queries
from equeue_core.kv import replica_log as replica
from equeue_core.record import header_fields, now_ms

from .database import SharedDb
from .index import RocksQueueIndex
from .replica_ops import RocksOps
from .view import View

_U32 = struct.Struct("<I")

# Smaller than LMDB's: a RocksDB read copies (and, compressed, decompresses) the whole chunk value,
# where LMDB hands out a view into its map. 16 KiB measured ~2x the random reads of 64 KiB.
DEFAULT_CHUNK_BYTES = 16 * 1024


def write_options(sync: bool) -> rocksdict.WriteOptions:
    opts = rocksdict.WriteOptions()
    opts.sync = sync
    return opts


class RocksMessageStore:
    """Opened by RocksEngine on its database, with its index; the database outlives both.

    `_write_lock` serializes the two writers of the log's bookkeeping: append (the broker's
    event loop) and delete_before (retention, on a worker thread): each one's read-modify-write
    of the in-memory next position and queue ranges stays whole, so retention never publishes a
    range computed before an append was written (which would hide that append's records). The
    compaction after a delete runs outside the lock: it only rewrites SST files, which RocksDB
    does beside writes all the time."""

    def __init__(self, settings: StoreSettings, shared: SharedDb, index: RocksQueueIndex) -> None:
        self.settings = settings
        self.index = index
        self.shared = shared
        self.view = View(shared)
        self.commit_sync = bool(settings.options.get("commit_sync", False))
        self.chunk_bytes = int(settings.options.get("chunk_bytes", DEFAULT_CHUNK_BYTES))
        self._write_opts = write_options(self.commit_sync)
        self._sync_opts = write_options(True)
        self.flusher = Flusher(self._sync, settings.flush, settings.flush_interval_ms, name="equeue-rocksdb-flusher")
        self._next = 0
        self._min = 0
        self._last_ts = 0  # newest store time given out: store times never go backwards
        self._write_lock = threading.Lock()
        self._opened = False
        self._closed = False
        self._close_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """RocksDB has already replayed its WAL (dropping a torn tail batch); this checks the newest
        record of every queue and reports whether the last stop was clean."""
        state = dict(self.shared.view["state"].items())
        fresh = keys.NEXT_POSITION not in state
        self._next = keys.U64_VALUE.unpack(state[keys.NEXT_POSITION])[0] if not fresh else 0
        self._min = keys.U64_VALUE.unpack(state[keys.MIN_POSITION])[0] if keys.MIN_POSITION in state else 0
        clean = fresh or state.get(keys.CLEAN) == b"\x01"
        self._put_state(keys.CLEAN, b"\x00")
        notes = ["new store"] if fresh else []
        for (topic, qid), (lo, hi) in self.index.ranges().items():
            if hi > lo:
                pos, size, _ = self.view.entry(topic, qid, hi - 1)
                try:
                    newest = queries.check_record(self.view.records([pos])[0], hi - 1, size, pos, lo, hi,
                                                  topic=topic, queue_id=qid)
                except CorruptRecordError as e:
                    raise StoreError(f"{topic}/{qid}: newest record is damaged ({e}); the RocksDB "
                                     f"files are corrupt, restore them from a copy") from e
                self._last_ts = max(self._last_ts, header_fields(newest)[10])
        if not clean:
            notes.append("unclean stop: RocksDB replayed its WAL; nothing to truncate or rebuild")
        self.flusher.start(self._next)
        self._opened = True
        records = sum(hi - lo for lo, hi in self.index.ranges().values())
        return RecoveryReport(clean=clean, records=records, notes=notes)

    def _put_state(self, key: bytes, value: bytes) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.put(key, value, self.shared.cf["state"])
        self.shared.db.write(wb, self._sync_opts)

    def _sync(self) -> int:
        end = self._next
        self.shared.db.flush_wal(True)
        return end

    def flush(self) -> None:
        self.shared.db.flush_wal(True)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._opened:
            self.flusher.stop()
            self._put_state(keys.CLEAN, b"\x01")

    # -- writer ---------------------------------------------------------------------------------

    def append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        """One WriteBatch for the whole batch: its chunks of records, their index entries, the
        queue's range and the next position."""
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
        wb = rocksdict.WriteBatch(raw_mode=True)
        log_cf = self.shared.cf["log"]
        for key, records in stamped.log_chunks:
            wb.put(key, bytes(records), log_cf)  # rocksdict's raw mode takes bytes only: one copy per chunk
        new_range = self.index.stage(wb, topic, queue_id,
                                     [(first, bytes(entries)) for first, entries in stamped.index_chunks])
        wb.put(keys.NEXT_POSITION, keys.U64_VALUE.pack(end), self.shared.cf["state"])
        try:
            self.shared.db.write(wb, self._write_opts)
        except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
            raise StoreError(f"RocksDB append failed: {e}") from e
        self._next = end
        self.index.publish(topic, queue_id, new_range)
        self.flusher.written(end)
        return AppendResult(first_offset, stamped.positions, end)

    def wait_flushed(self, end_position: int) -> concurrent.futures.Future:
        return self.flusher.wait(end_position)

    def delete_before(self, position: int) -> int:
        """Range-delete every chunk that lies wholly below position, with its index entries, in one
        WriteBatch (a chunk holding position stays whole), then compact that key range so the disk
        space comes back. Returns the bytes of records released.

        Safe beside append on another thread: the batch is built and written under
        `_write_lock` (class docstring); readers see the state before the batch or after it."""
        with self._write_lock:
            first_kept, released = self._delete_below(position)
        if released:
            self.shared.view["log"].compact_range(None, keys.log_key(first_kept))
        return released

    def reusable_bytes(self) -> int:
        """0: the compaction after a delete gives the disk space back."""
        return 0

    def _delete_below(self, position: int) -> tuple[int, int]:
        position = min(position, self._next)
        it = self.shared.view["log"].iter()
        it.seek_for_prev(keys.log_key(position))
        first_kept = self._next
        if it.valid():
            start = keys.position_of(it.key())
            if start + len(it.value()) > position:
                first_kept = start
            else:
                it.next()
                first_kept = keys.position_of(it.key()) if it.valid() else self._next
        del it
        if first_kept <= self._min:
            return first_kept, 0
        wb = rocksdict.WriteBatch(raw_mode=True)
        published = []
        for (topic, qid) in self.index.ranges():
            new_range = self.index.drop_below(wb, topic, qid, first_kept)
            if new_range is not None:
                published.append((topic, qid, new_range))
        wb.delete_range(keys.log_key(0), keys.log_key(first_kept), self.shared.cf["log"])
        wb.put(keys.MIN_POSITION, keys.U64_VALUE.pack(first_kept), self.shared.cf["state"])
        self.shared.db.write(wb, self._sync_opts)
        for topic, qid, new_range in published:
            self.index.publish(topic, qid, new_range)
        released = first_kept - self._min
        self._min = first_kept
        return first_kept, released

    # -- replication (contracts.ReplicaLog; equeue_core/kv/replica_log.py) -----------------------

    def end_position(self) -> int:
        return self._next

    def start_position(self) -> int:
        return min(self._min, self._next)

    def read_log(self, position: int, max_bytes: int) -> bytes:
        return replica.read_log(RocksOps(self.shared), position, max_bytes, self._next)

    def append_log(self, position: int, data: bytes | bytearray | memoryview) -> int:
        """One WriteBatch: the copied records, their index entries, ranges, next position."""
        with self._write_lock:
            ops = RocksOps(self.shared)
            copied, ranges = replica.stage_append(ops, position, self._next, data, self.index.ranges(),
                                                  self.chunk_bytes)
            try:
                self.shared.db.write(ops.wb, self._write_opts)
            except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
                raise StoreError(f"RocksDB append failed: {e}") from e
            self._next = copied.end
            self._last_ts = max(self._last_ts, copied.last_store_ts)
            for (topic, qid), new_range in ranges.items():
                self.index.publish(topic, qid, new_range)
            self.flusher.written(copied.end)
            return copied.end

    def truncate_log(self, position: int) -> None:
        """One WriteBatch, written with sync before returning."""
        with self._write_lock:
            if position == self._next:
                return
            ops = RocksOps(self.shared)
            ranges = replica.stage_truncate(ops, position, self._next, self._min, self.index.ranges())
            self.shared.db.write(ops.wb, self._sync_opts)
            self._next = position
            for (topic, qid), new_range in ranges.items():
                self.index.publish(topic, qid, new_range)
            self.flusher.flushed = min(self.flusher.flushed, position)
            self.flusher.written(position)

    # -- reads (any thread) ---------------------------------------------------------------------

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
                   tag_hashes: frozenset[int] | None = None) -> PullResult:
        return self.view.pull(topic, queue_id, offset, max_count, max_bytes, tag_hashes,
                              self.index.queue_range(topic, queue_id))

    def read_position(self, position: int) -> bytes:
        return self.view.record(position)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self.index.queue_range(topic, queue_id)

    def queues(self) -> dict[str, list[int]]:
        return self.index.queues()

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        return self.view.offset_for_timestamp(topic, queue_id, ts_ms, self.index.queue_range(topic, queue_id))
