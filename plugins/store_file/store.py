"""FileMessageStore: the default MessageStore (contracts.MessageStore) over a chunked commit log.

Guarantees:
- append() stamps and writes a batch with one write(2), then indexes it; it never fsyncs. The
  flusher thread (equeue_core.flush.Flusher) makes data durable; wait_flushed(end) resolves after.
- store_ts never goes backwards within a store (max(clock, last)), so offset_for_timestamp can
  binary-search the index.
- a record is served only if it verifies (read_position) or was indexed by this process after it
  was written (read_queue); recovery in open() guarantees the index points at verified records.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence

from equeue_core.contracts import AppendResult, PullResult, RecoveryReport, StoreSettings
from equeue_core.errors import (
    CorruptRecordError,
    MessageNotFoundError,
    OffsetOutOfRangeError,
    StoreError,
)
from equeue_core.flush import Flusher
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE, OFF_POSITION, index_entries, stamp_batch, verify
from equeue_core.writer_lock import WriterLock

from .atomic import write_atomic
from .commit_log import CommitLog
from .constants import (
    ABORT,
    CHECKPOINT,
    CHECKPOINT_EVERY_SECONDS,
    COMMITLOG_DIR,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAP_HIGH_BYTES,
    DEFAULT_MAP_LOW_BYTES,
    DEFAULT_RING_BYTES,
    MAP_IDLE_SECONDS,
    MIN_CHUNK_SIZE,
)
from .queue_index import FileQueueIndex
from .recovery import pack_checkpoint, read_checkpoint, scan_log
from .store_info import load_store_info, write_store_info

log = logging.getLogger(__name__)

_U64 = struct.Struct("<Q")
_STORE_TS = struct.Struct("<q")
_OFF_STORE_TS = 44
_SCAN_WITH_FILTER = 4096  # index entries a filtered pull may scan past non-matching ones


def _int_option(options: dict, name: str, default: int) -> int:
    v = options.get(name)
    return default if v in (None, "") else int(v)


class FileMessageStore:
    """See the module docstring. One writer thread calls append(); reads may come from any thread."""

    def __init__(self, settings: StoreSettings, index: FileQueueIndex,
                 writer_lock: WriterLock | None = None) -> None:
        """`writer_lock`: the data directory's lock if the caller (FileEngine) already holds it;
        otherwise open() takes it. Either way the store releases it when closed."""
        self.settings = settings
        self.index = index
        self.data_dir = settings.data_dir
        opts = settings.options
        info = load_store_info(self.data_dir)
        chunk_size = _int_option(opts, "chunk_size", DEFAULT_CHUNK_SIZE)
        if info is not None and int(info["chunk_size"]) != chunk_size:
            if "chunk_size" in opts:
                log.warning("chunk_size %d in config differs from %d stored in %s; keeping the stored one",
                            chunk_size, int(info["chunk_size"]), self.data_dir)
            chunk_size = int(info["chunk_size"])
        if chunk_size < MIN_CHUNK_SIZE:
            raise StoreError(f"chunk_size must be at least {MIN_CHUNK_SIZE}")
        self.chunk_size = chunk_size
        self._index_file_entries = int(info["index_file_entries"]) if info else index.entries_per_file
        self._has_info = info is not None
        self.log = CommitLog(os.path.join(self.data_dir, COMMITLOG_DIR), chunk_size,
                             _int_option(opts, "ring_bytes", DEFAULT_RING_BYTES),
                             _int_option(opts, "map_low_bytes", DEFAULT_MAP_LOW_BYTES),
                             _int_option(opts, "map_high_bytes", DEFAULT_MAP_HIGH_BYTES),
                             float(opts.get("map_idle_seconds") or MAP_IDLE_SECONDS))
        self._next: dict[tuple[str, int], int] = {}     # next queue offset to assign
        self._min: dict[tuple[str, int], int] = {}      # first readable queue offset
        self._last_ts = 0
        self._flusher = Flusher(self._flush_to_disk, settings.flush, settings.flush_interval_ms,
                                name="equeue-file-flusher")
        self._last_checkpoint = 0.0
        self._checkpointed = -1
        self._checkpoint_lock = threading.Lock()
        self._opened = False
        self._closed = False
        self._broken: BaseException | None = None
        self._writer_lock = writer_lock

    # ------------------------------------------------------------ open / recovery
    def open(self) -> RecoveryReport:
        """Recover (see recovery.py), start the flusher, and mark the store open (abort file)."""
        if self._writer_lock is None:
            self._writer_lock = WriterLock.acquire(self.data_dir)  # StoreLockedError if held
        os.makedirs(self.log.dir, exist_ok=True)
        if not self._has_info:
            write_store_info(self.data_dir, self.chunk_size, self._index_file_entries)
        abort_path = os.path.join(self.data_dir, ABORT)
        clean = not os.path.exists(abort_path)
        checkpoint = read_checkpoint(os.path.join(self.data_dir, CHECKPOINT))
        chunks = self.log.chunks
        start = self.log.start
        if checkpoint is None or checkpoint < start or (
                chunks and checkpoint - checkpoint % self.chunk_size not in chunks and checkpoint > start):
            if chunks and checkpoint is not None:
                log.warning("checkpoint %s does not fit the log files; scanning the whole log", checkpoint)
            checkpoint = start
        elif chunks and checkpoint > start:
            cpath = self.log.path(checkpoint - checkpoint % self.chunk_size)
            if os.path.getsize(cpath) < checkpoint % self.chunk_size:
                log.error("chunk %s is shorter than the checkpoint %d says: data the store had "
                          "fsynced is gone; scanning the whole log", cpath, checkpoint)
                checkpoint = start
        report = RecoveryReport(clean=clean)
        result = scan_log(self.log.dir, chunks, self.chunk_size, checkpoint)
        report.truncated_bytes = result.truncated_bytes
        report.records = result.records
        report.notes.extend(result.notes)
        if result.truncated_bytes:
            log.error("commit log recovery in %s: TRUNCATED %d bytes of torn or corrupt data "
                      "after position %d (%s)", self.data_dir, result.truncated_bytes, result.end,
                      "; ".join(result.notes))
        end = result.end
        report.rebuilt_entries = self._repair_index(end, result.entries, report)
        if report.rebuilt_entries == -1:  # a gap: the index lags the checkpoint; rebuild from the start
            report.notes.append("index behind the checkpoint: rescanned the whole log")
            full = scan_log(self.log.dir, chunks, self.chunk_size, self.log.start)
            report.rebuilt_entries = self._repair_index(full.end, full.entries, report, final=True)
        self.log.open_for_write(end)
        if not clean or result.records:
            # what the crashed writer left in the page cache is part of the log now: make it
            # durable before the checkpoint below vouches for it
            self.log.sync_range(checkpoint, end)
            self.index.sync_all()
        self._init_min_offsets(init_ts=True)
        with open(abort_path, "wb"):
            pass
        self._flusher.start(end)
        self._write_checkpoint(end)
        self._opened = True
        if not clean:
            log.warning("store %s was not closed cleanly: recovered to position %d, %d records "
                        "scanned, %d index entries rebuilt, %d bytes truncated", self.data_dir, end,
                        report.records, report.rebuilt_entries, report.truncated_bytes)
        return report

    def _repair_index(self, end: int, scanned: dict[tuple[str, int], list[tuple[int, bytes]]],
                      report: RecoveryReport, final: bool = False) -> int:
        """Drop index entries pointing at or past end; add the scanned records the index lacks.
        Returns entries added, or -1 when a queue's scanned records do not continue its index."""
        index = self.index
        for topic, qids in index.queues().items():
            for qid in qids:
                lo, hi = index.queue_range(topic, qid)
                first_bad = self._first_entry_at_or_after(topic, qid, lo, hi, end)
                if first_bad < hi:
                    dropped = index.truncate(topic, qid, first_bad)
                    report.notes.append(f"index {topic}/{qid}: dropped {dropped} entries past the log end")
        added = 0
        for (topic, qid), recs in scanned.items():
            lo, hi = index.queue_range(topic, qid)
            todo = [(o, e) for o, e in recs if o >= hi]
            if not todo:
                continue
            if todo[0][0] != hi:
                if not final:
                    return -1
            if todo[0][0] != hi and not (lo == hi == 0):  # an empty index may start anywhere
                log.error("index %s/%s ends at %d but the log continues it only from %d; "
                          "not rebuilding it", topic, qid, hi, todo[0][0])
                report.notes.append(f"index {topic}/{qid}: cannot be continued from the log")
                continue
            run: list[bytes] = []
            first = expect = todo[0][0]
            for o, e in todo:
                if o != expect:
                    index.add(topic, qid, first, b"".join(run))
                    run, first = [], o
                run.append(e)
                expect = o + 1
            index.add(topic, qid, first, b"".join(run))
            added += len(todo)
        return added

    def _first_entry_at_or_after(self, topic: str, qid: int, lo: int, hi: int, position: int) -> int:
        """The first offset in [lo, hi) whose entry's position is >= position (hi if none);
        positions grow with offsets within a queue, so this is a binary search."""
        read = self.index.read
        if hi <= lo:
            return hi
        last = read(topic, qid, hi - 1, 1)
        if len(last) == INDEX_ENTRY_SIZE and _U64.unpack_from(last)[0] < position:
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            e = read(topic, qid, mid, 1)
            if len(e) == INDEX_ENTRY_SIZE and _U64.unpack_from(e)[0] < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _init_min_offsets(self, init_ts: bool = False) -> None:
        """Each queue's first readable offset (its first entry inside the stored chunks); at open
        also the newest store_ts, so store times stay non-decreasing across restarts."""
        start = self.log.start
        for topic, qids in self.index.queues().items():
            for qid in qids:
                lo, hi = self.index.queue_range(topic, qid)
                m = self._first_entry_at_or_after(topic, qid, lo, hi, start) if start else lo
                self._min[(topic, qid)] = m
                if m > lo:
                    self.index.set_min(topic, qid, m)
                if init_ts and m < hi:
                    try:
                        self._last_ts = max(self._last_ts, self._store_ts_at(topic, qid, hi - 1))
                    except OffsetOutOfRangeError:
                        pass

    # ------------------------------------------------------------ writing
    def append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        """Assign offsets/positions, stamp, write once, index once (see module docstring)."""
        if self._broken is not None:
            raise StoreError(f"store is unusable after a failed write: {self._broken}")
        key = (topic, queue_id)
        first = self._next.get(key)
        if first is None:
            first = self._next[key] = self.index.queue_range(topic, queue_id)[1]
        base = self.log.reserve(len(batch))
        positions = [base + s for s in starts] if base else list(starts)
        ts = time.time_ns() // 1_000_000
        if ts < self._last_ts:
            ts = self._last_ts
        self._last_ts = ts
        stamp_batch(batch, starts, positions, first, queue_id, ts)
        end = self.log.write(batch, base)  # on failure nothing was written (StoreError)
        try:
            self.index.add(topic, queue_id, first, index_entries(batch, starts, positions))
        except BaseException as e:
            # the log holds records the index lacks: appending on would hand out their offsets
            # again. Refuse further appends; the next open rebuilds the index from the log.
            self._broken = e
            raise StoreError(f"index write failed, store needs a restart: {e}") from e
        self._next[key] = first + len(starts)
        self.log.publish(end)
        self._flusher.written(end)
        return AppendResult(first, positions, end)

    def wait_flushed(self, end_position: int) -> concurrent.futures.Future:
        return self._flusher.wait(end_position)

    def _flush_to_disk(self) -> int:
        """The flusher thread's job: fsync log then index, then maybe move the checkpoint."""
        end = self.log.sync()
        self.index.flush()
        self.log.sweep_maps()
        now = time.monotonic()
        if end != self._checkpointed and now - self._last_checkpoint >= CHECKPOINT_EVERY_SECONDS:
            self._write_checkpoint(end)
        return end

    def _write_checkpoint(self, end: int) -> None:
        with self._checkpoint_lock:
            if end < self._checkpointed:
                return
            write_atomic(os.path.join(self.data_dir, CHECKPOINT), pack_checkpoint(end))
            self._checkpointed = end
            self._last_checkpoint = time.monotonic()

    def flush(self) -> None:
        """Make everything appended so far durable before returning. It fsyncs on the calling
        thread, so the broker calls it from an executor or at shutdown, never on its event loop."""
        self.log.sync()
        self.index.flush()

    # ------------------------------------------------------------ reading
    def _range(self, topic: str, queue_id: int) -> tuple[int, int]:
        key = (topic, queue_id)
        hi = self._next.get(key)
        lo = self._min.get(key)
        if hi is None or lo is None:
            ilo, ihi = self.index.queue_range(topic, queue_id)
            hi = ihi if hi is None else hi
            lo = ilo if lo is None else lo
        return lo, hi

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        return self._range(topic, queue_id)

    def queues(self) -> dict[str, list[int]]:
        return self.index.queues()

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int, tag_hashes: frozenset[int] | None = None) -> PullResult:
        lo, hi = self._range(topic, queue_id)
        if offset == hi:
            return PullResult(b"", 0, offset, lo, hi)
        if offset < lo or offset > hi:
            raise OffsetOutOfRangeError(f"offset {offset} of {topic}/{queue_id} is outside [{lo}, {hi}]",
                                        min_offset=lo, max_offset=hi)
        scan = max_count if tag_hashes is None else max(max_count, _SCAN_WITH_FILTER)
        entries = self.index.read(topic, queue_id, offset, min(scan, hi - offset))
        runs: list[tuple[int, int]] = []
        run_start = run_end = -1
        count = 0
        total = 0
        scanned = 0
        for pos, size, th in INDEX_ENTRY.iter_unpack(entries):
            if tag_hashes is not None and th not in tag_hashes:
                scanned += 1
                continue
            if count and total + size > max_bytes:
                break
            scanned += 1
            count += 1
            total += size
            if pos == run_end:
                run_end += size
            else:
                if run_end >= 0:
                    runs.append((run_start, run_end))
                run_start, run_end = pos, pos + size
            if count >= max_count:
                break
        if run_end >= 0:
            runs.append((run_start, run_end))
        parts = []
        for a, b in runs:
            data = self.log.read(a, b)
            if data is None:  # deleted by retention meanwhile
                lo = self._range(topic, queue_id)[0]
                raise OffsetOutOfRangeError(f"offset {offset} of {topic}/{queue_id} was deleted",
                                            min_offset=lo, max_offset=hi)
            parts.append(data)
        records = parts[0] if len(parts) == 1 else b"".join(parts)
        return PullResult(records, count, offset + scanned, lo, hi)

    def read_position(self, position: int) -> bytes:
        """The record at position, verified (size, magic, lengths, crc, stamped position)."""
        if position < self.log.start or position >= self.log.published_end or position < 0:
            raise MessageNotFoundError(f"no record at position {position}")
        cs = self.chunk_size
        chunk_end = position - position % cs + cs
        head = self.log.read(position, min(position + 76, chunk_end))
        if head is None or len(head) < 76:
            raise MessageNotFoundError(f"no record at position {position}")
        size = int.from_bytes(head[:4], "little")
        if size < 76 or position + size > min(chunk_end, self.log.published_end):
            raise MessageNotFoundError(f"no record at position {position}")
        data = self.log.read(position, position + size)
        try:
            if data is None or verify(data) != size or _U64.unpack_from(data, OFF_POSITION)[0] != position:
                raise MessageNotFoundError(f"no record at position {position}")
        except CorruptRecordError as e:
            raise MessageNotFoundError(f"no record at position {position}") from e
        return data

    def _store_ts_at(self, topic: str, queue_id: int, offset: int) -> int:
        e = self.index.read(topic, queue_id, offset, 1)
        if len(e) < INDEX_ENTRY_SIZE:
            raise OffsetOutOfRangeError(f"offset {offset} gone", min_offset=offset, max_offset=offset)
        pos = _U64.unpack_from(e)[0]
        head = self.log.read(pos, pos + _OFF_STORE_TS + 8)
        if head is None:
            raise OffsetOutOfRangeError(f"offset {offset} gone", min_offset=offset, max_offset=offset)
        return _STORE_TS.unpack_from(head, _OFF_STORE_TS)[0]

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """Binary search over the index: store_ts is non-decreasing within the store."""
        lo, hi = self._range(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                ts = self._store_ts_at(topic, queue_id, mid)
            except OffsetOutOfRangeError:  # deleted under us: everything below is gone too
                lo = mid + 1
                continue
            if ts < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------ retention / shutdown
    def delete_before(self, position: int) -> int:
        """Delete chunks wholly below position; queue min offsets move past their records.
        Returns bytes released.

        Safe on a worker thread while the writer appends, without a lock of its own: the log
        deletes only chunks wholly below position and below the chunk being written, and
        changes its chunk list under the lock a roll takes; the minimum offsets are a map the
        writer never touches (it keeps the next offsets); the index's set_min only removes
        files wholly below the new minimum, never a queue's newest or write file, while add
        only appends to that list. A reader that loses a race with the delete gets
        OffsetOutOfRangeError (read_queue) or MessageNotFoundError, never wrong bytes."""
        released = self.log.delete_before(position)
        if released:
            self._init_min_offsets()
        return released

    def close(self) -> None:
        """Flush, write the checkpoint, remove the abort marker: the next open is clean."""
        if self._closed:
            return
        self._closed = True
        if not self._opened:
            self.log.close()
            self._release_lock()
            return
        self._flusher.stop()
        end = self.log.sync()
        self.index.flush()
        self._write_checkpoint(end)
        self.log.close()
        self.index.close()
        try:
            os.unlink(os.path.join(self.data_dir, ABORT))
        except FileNotFoundError:
            pass
        self._release_lock()

    def reusable_bytes(self) -> int:
        """0: retention deletes whole chunk files, so the disk gets the space back at once."""
        return 0

    def _release_lock(self) -> None:
        if self._writer_lock is not None:
            self._writer_lock.release()
            self._writer_lock = None
