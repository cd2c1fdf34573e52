"""FileMessageStore: the default MessageStore (contracts.MessageStore) over a chunked commit log.

Guarantees:
- append() stamps and writes a batch with one write(2), then indexes it; it never fsyncs. The
  flusher thread (equeue_core.flush.Flusher) makes the log durable; wait_flushed(end) resolves
  after. The index and the checkpoint are made durable by a thread of their own (the
  checkpointer, at most every CHECKPOINT_EVERY_SECONDS), so a flush=sync send never waits for
  them: with 1000 written queues a checkpoint fsyncs 1000 index files (~0.2 s here), which every
  sync send arriving meanwhile used to wait for.
- store_ts never goes backwards within a store (max(clock, last)), so offset_for_timestamp can
  binary-search the index.
- a record is served only if it was verified in this process (docs/stores.md, "Every record
  served is verified"): read_position checks every record (record.damage); read_queue checks every
  record below `_verified_from` and trusts the ones at or past it, because those were verified
  once already in this process: by open()'s recovery scan (record.verify over the bytes on disk),
  or by append(), whose stamp_batch computed the crc over the very bytes it then wrote. Such a
  record is read back either from the ring, which returns exactly the bytes written or nothing
  (every slot a read touches is checked before and after the copy), or from the chunk file
  through the page cache, which holds what write(2) was given. What this does not catch is damage
  to those bytes while this process runs (a disk that silently returns other bytes after the page
  was evicted); the next open() puts them below `_verified_from` again, so they are checked then.
- a damaged record is never served: a pull stops before it, or raises CorruptRecordError naming
  topic, queue, offset and position when it is the first. A record that fails in a ring copy is
  re-read from its chunk file before it is called damaged.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import struct
import threading
import time
from collections.abc import Iterable, Sequence

from equeue_core.contracts import (
    AppendResult,
    IndexRange,
    PullResult,
    RecoveryReport,
    StoreSettings,
)
from equeue_core.errors import (
    ConfigError,
    CorruptRecordError,
    MessageNotFoundError,
    OffsetOutOfRangeError,
    StoreError,
)
from equeue_core.export import first_damaged, index_entry_dtype
from equeue_core.flush import Flusher
from equeue_core.record import (
    CRC_FROM,
    HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    MAGIC,
    OFF_POSITION,
    VERSION,
    corrupt_record,
    crc32c,
    damage,
    index_entries,
    index_runs,
    stamp_batch,
    verify,
)
from equeue_core.store_sections import append_one_by_one as _one_by_one
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
    END_OF_CHUNK_SIZE,
    MAP_IDLE_SECONDS,
    MIN_CHUNK_SIZE,
)
from .queue_index import FileQueueIndex
from .recovery import collect_queue_records, pack_checkpoint, read_checkpoint_queues, scan_log
from .store_info import load_store_info, write_store_info

log = logging.getLogger(__name__)

_U64 = struct.Struct("<Q")
_HEAD20 = struct.Struct("<IBBHIQ")  # size, magic, version, flags, crc, position: a record's first 20 bytes
_STORE_TS = struct.Struct("<q")
_OFF_STORE_TS = 44
_SCAN_WITH_FILTER = 4096  # index entries a filtered pull may scan past non-matching ones
# A pull below _verified_from of at least this many records is checked all at once (numpy and a
# batched crc, ~20 us to set up), a smaller one record by record (~1 us a record in Python).
VERIFY_AT_ONCE = 32


def _first_damaged(data: bytes, base: int, picked: list[tuple[int, int, int]], first: int,
                   last: int) -> int | None:
    """Index (into picked) of the first of picked[first:last] that does not verify in data (the
    bytes of log positions base..), or None if all verify. record.damage's checks, its common
    case inlined (one unpack, one crc per record): this loop is the price of a verified read."""
    unpack = _HEAD20.unpack_from
    crc = crc32c
    mv = memoryview(data)
    end = len(data)
    for k in range(first, last):
        _qoff, pos, size = picked[k]
        at = pos - base
        if at + size <= end and size >= HEADER_SIZE:
            whole, magic, version, _flags, c, stamped = unpack(data, at)
            if (whole == size and magic == MAGIC and version == VERSION and stamped == pos
                    and crc(mv[at + CRC_FROM:at + size]) == c):
                continue
        if damage(data, at, size, pos) is not None:
            return k
    return None


def _all_intact(data: bytes, entries: memoryview, tag_hashes: frozenset[int] | None, count: int) -> bool:
    """Whether `data`, the records of the pull's first `count` entries (those of `tag_hashes`
    only, when given) laid end to end, verifies whole: every record's size, magic, version,
    stamped position and crc at once (export.first_damaged)."""
    import numpy as np

    e = np.frombuffer(entries, dtype=index_entry_dtype())
    if tag_hashes is not None:
        e = e[np.isin(e["tag_hash"], np.fromiter(tag_hashes, dtype=np.uint64, count=len(tag_hashes)))]
    e = e[:count]
    size = e["size"].astype(np.int64)
    if len(e) != count or int(size.sum()) != len(data):
        return False
    return first_damaged(data, np.cumsum(size) - size, size, e["position"]) is None


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
        if settings.max_batch_bytes and chunk_size - END_OF_CHUNK_SIZE < settings.max_batch_bytes:
            # a batch never spans chunks: a frame-sized batch would be refused forever
            where = f"stored in {self.data_dir}/store.json" if info is not None else "store_options.file.chunk_size"
            raise ConfigError(f"chunk_size {chunk_size} ({where}) is too small for max_frame_size "
                              f"{settings.max_batch_bytes}: a batch must fit in one chunk, so chunk_size must "
                              f"be at least max_frame_size + {END_OF_CHUNK_SIZE}")
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
        self._checkpointed = -1
        self._checkpoint_lock = threading.Lock()
        self._round_lock = threading.Lock()  # one checkpoint round at a time (thread or caller)
        self._durability_lock = threading.Lock()  # _durable, _index_durable, _checkpoint_cap
        self._stop_checkpoints = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="equeue-file-checkpoint",
                                              daemon=True)
        self._opened = False
        self._closed = False
        self._broken: BaseException | None = None
        # Records at or past this position were verified in this process: by the recovery scan
        # in open() or by stamp_batch's crc over the very bytes append() wrote. read_queue serves
        # those without a second crc (see the module docstring); everything below is checked.
        self._verified_from = 1 << 63
        self._durable = 0                   # end of the last flush that succeeded
        self._index_durable = 0             # end of the last flush that fsynced the index too
        self._checkpoint_cap = 1 << 63      # see _flush_to_disk: lowered for good by a failed fsync
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
        found = read_checkpoint_queues(os.path.join(self.data_dir, CHECKPOINT))
        checkpoint, manifest = found if found is not None else (None, None)
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
        verified_from = checkpoint
        report.truncated_bytes = result.truncated_bytes
        report.records = result.records
        report.notes.extend(result.notes)
        if result.truncated_bytes:
            log.error("commit log recovery in %s: TRUNCATED %d bytes of torn or corrupt data "
                      "after position %d (%s)", self.data_dir, result.truncated_bytes, result.end,
                      "; ".join(result.notes))
        end = result.end
        behind = self._repair_index(end, result.entries, report)
        if self._check_indexes(manifest or {}, behind, end, report):
            verified_from = end  # entries marking lost records sit below end: reads check them
        for r in report.rebuilt:
            log.warning("recovery in %s: rebuilt the index of %s from the log", self.data_dir, r)
        for r in report.lost:
            log.error("recovery in %s: LOST %s: no record in the log; reads of them fail", self.data_dir, r)
        self.log.open_for_write(end)
        self._verified_from = verified_from
        if not clean or result.records:
            # what the crashed writer left in the page cache is part of the log now: make it
            # durable before the checkpoint below vouches for it
            self.log.sync_range(checkpoint, end)
            self.index.sync_all()
        self._init_min_offsets(init_ts=True)
        with open(abort_path, "wb"):
            pass
        self._flusher.start(end)
        self._durable = self._index_durable = end
        self._write_checkpoint(end)
        self._checkpointer.start()
        self._opened = True
        if not clean:
            log.warning("store %s was not closed cleanly: recovered to position %d, %d records "
                        "scanned, %d index entries rebuilt, %d bytes truncated", self.data_dir, end,
                        report.records, report.rebuilt_entries, report.truncated_bytes)
        return report

    def _repair_index(self, end: int, scanned: dict[tuple[str, int], list[tuple[int, bytes]]],
                      report: RecoveryReport) -> set[tuple[str, int]]:
        """Drop index entries pointing at or past end (lost: their records were cut off); add the
        scanned records the index lacks (rebuilt). Returns the queues whose scanned records do not
        continue their index (it lags the checkpoint): _check_indexes rebuilds those whole."""
        index = self.index
        for topic, qids in index.queues().items():
            for qid in qids:
                lo, hi = index.queue_range(topic, qid)
                first_bad = self._first_entry_at_or_after(topic, qid, lo, hi, end)
                if first_bad < hi:
                    dropped = index.truncate(topic, qid, first_bad)
                    report.notes.append(f"index {topic}/{qid}: dropped {dropped} entries past the log end")
                    report.lost.append(IndexRange(topic, qid, first_bad, first_bad + dropped - 1))
        behind: set[tuple[str, int]] = set()
        for (topic, qid), recs in scanned.items():
            lo, hi = index.queue_range(topic, qid)
            todo = [(o, e) for o, e in recs if o >= hi]
            if not todo:
                continue
            if any(todo[i][0] != hi + i for i in range(len(todo))):
                behind.add((topic, qid))
                continue
            index.add(topic, qid, hi, b"".join(e for _, e in todo))
            report.rebuilt.append(IndexRange(topic, qid, hi, hi + len(todo) - 1))
            report.rebuilt_entries += len(todo)
        return behind

    def _check_indexes(self, manifest: dict[tuple[str, int], int], behind: set[tuple[str, int]],
                       end: int, report: RecoveryReport) -> bool:
        """Check every queue's index against the log: no hole (a missing or short index file
        below its newest), not shorter than the checkpoint's record of its end (a lost or
        truncated index file), not lagging the scanned tail (`behind`). A queue that fails is
        rebuilt whole from the log (one non-truncating scan for all of them). Returns True if
        offsets were marked lost (see _rebuild_queue)."""
        index = self.index
        problems: dict[tuple[str, int], int] = {}
        keys = {(t, q) for t, qs in index.queues().items() for q in qs} | set(manifest) | behind
        for key in sorted(keys):
            _lo, hi = index.queue_range(*key)
            want = manifest.get(key, 0)
            hole = index.first_hole(*key) if hasattr(index, "first_hole") else None
            if key in behind:
                why = "lags the log"
            elif hi < want:
                why = f"ends at {hi}, the checkpoint says {want}"
            elif hole is not None:
                why = f"has no entries from offset {hole}"
            else:
                continue
            report.notes.append(f"index {key[0]}/{key[1]} {why}: rebuilt from the log")
            problems[key] = max(want, hi)
        if not problems:
            return False
        report.notes.append("index behind the checkpoint: rescanned the whole log")
        found, notes = collect_queue_records(self.log.dir, self.log.chunks, self.chunk_size, end, set(problems))
        report.notes.extend(notes)
        marked = False
        for key, target in sorted(problems.items()):
            marked |= self._rebuild_queue(key, found.get(key, []), target, end, report)
        return marked

    def _rebuild_queue(self, key: tuple[str, int], recs: list[tuple[int, bytes]], target: int, end: int,
                       report: RecoveryReport) -> bool:
        """Rewrite one queue's index from its records in the log (ascending queue offsets). The
        queue keeps every offset it had handed out (up to `target`, the larger of its old index
        end and the checkpoint's): an offset without a record gets an entry of size 0 (docs/
        format.md: "lost"), which a read refuses as corrupt, so an offset is never reused and a
        consumer stops there until skipped. Returns True if such entries were written."""
        topic, qid = key
        index = self.index
        start = self.log.start
        recs = [r for i, r in enumerate(recs) if i == 0 or r[0] > recs[i - 1][0]]
        if recs:
            target = max(target, recs[-1][0] + 1)
        if not recs and start > 0:
            # every record of the queue went with retention: keep its end (one marker entry
            # below the log start, so the queue reads as empty from `target` on)
            index.reset(topic, qid, max(0, target - 1))
            if target:
                index.add(topic, qid, target - 1, INDEX_ENTRY.pack(start - 1, 0, 0))
            return False
        first = 0 if start == 0 or not recs else recs[0][0]
        out = bytearray()
        lost: list[list[int]] = []
        rebuilt: list[list[int]] = []
        i = 0
        for off in range(first, target):
            if i < len(recs) and recs[i][0] == off:
                out += recs[i][1]
                i += 1
                runs = rebuilt
            else:
                nxt = _U64.unpack_from(recs[i][1])[0] if i < len(recs) else end - 1
                out += INDEX_ENTRY.pack(max(nxt, 0), 0, 0)
                runs = lost
            if runs and runs[-1][1] == off - 1:
                runs[-1][1] = off
            else:
                runs.append([off, off])
        # what _repair_index said about this queue is superseded by the whole-queue answer below
        report.rebuilt[:] = [r for r in report.rebuilt if (r.topic, r.queue_id) != key]
        report.lost[:] = [r for r in report.lost if (r.topic, r.queue_id) != key]
        index.reset(topic, qid, first)
        if out:
            index.add(topic, qid, first, bytes(out))
        report.rebuilt.extend(IndexRange(topic, qid, a, b) for a, b in rebuilt)
        report.lost.extend(IndexRange(topic, qid, a, b) for a, b in lost)
        report.rebuilt_entries = sum(r.last_offset - r.first_offset + 1 for r in report.rebuilt)
        return bool(lost)

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
            first = self._queue_end(key)
        base = self.log.reserve(len(batch))
        positions = [base + s for s in starts] if len(starts) != 1 else [base + starts[0]]
        stamp_batch(batch, starts, positions, first, queue_id, self._store_ts())
        end = self.log.write(batch, base)  # on failure nothing was written (StoreError)
        failed = self._index_or_take_back(topic, queue_id, first, batch, starts, positions, base)
        if failed is not None:
            raise StoreError(f"index write failed, nothing stored: {failed}") from failed
        self._next[key] = first + len(starts)
        self.log.publish(end)
        self._flusher.written(end)
        return AppendResult(first, positions, end)

    def append_sections(self, sections: Sequence[tuple[str, int, bytearray, Sequence[int]]]
                        ) -> tuple[list[AppendResult], StoreError | None]:
        """Several appends, in order, with one write(2) for all their records (a SEND_MULTI,
        equeue_core/store_sections.py): the offsets, positions, stamps and index entries each
        `append` would give, the sections' records back to back in the log. The results of the
        sections stored and None; or, when a section's index write fails, the results before it
        and the error: that section and every later one are taken back (log and index), as
        `append` takes back its batch. A failed log write stores nothing (StoreError raised)."""
        if self._broken is not None:
            raise StoreError(f"store is unusable after a failed write: {self._broken}")
        total = sum(len(section[2]) for section in sections)
        if total > self.log.chunk_size // 2:  # (one chunk holds them all; big ones go one by one)
            return _one_by_one(self, sections)
        base = self.log.reserve(total)
        ts = self._store_ts()
        nexts = self._next
        firsts: dict[tuple[str, int], int] = {}  # the next offset of each queue, this request's sections counted
        plan = []
        pos = base
        for topic, queue_id, batch, starts in sections:
            key = (topic, queue_id)
            first = firsts.get(key)
            if first is None:
                first = nexts.get(key)
                if first is None:
                    first = self._queue_end(key)
            positions = [pos + s for s in starts]
            stamp_batch(batch, starts, positions, first, queue_id, ts)
            firsts[key] = first + len(starts)
            plan.append((topic, queue_id, batch, starts, first, positions, pos))
            pos += len(batch)
        end = self.log.write_many([section[2] for section in sections], base)  # StoreError: nothing written
        results: list[AppendResult] = []
        failed = None
        for topic, queue_id, batch, starts, first, positions, at in plan:
            # a failure takes this section and the later ones back out of the log (cut at this
            # section) and the index (only this one was added)
            error = self._index_or_take_back(topic, queue_id, first, batch, starts, positions, at)
            if error is not None:
                failed = StoreError(f"index write failed, this section and the later ones not stored: {error}")
                failed.__cause__ = error
                end = at
                break
            nexts[(topic, queue_id)] = first + len(starts)
            results.append(AppendResult(first, positions, at + len(batch)))
        if results:
            self.log.publish(end)
            self._flusher.written(end)
        if failed is not None and not results:
            raise failed
        return results, failed

    def _queue_end(self, key: tuple[str, int]) -> int:
        """A queue's next offset on its first append in this process: its index's end (kept in
        _next from then on)."""
        first = self._next[key] = self.index.queue_range(*key)[1]
        return first

    def _store_ts(self) -> int:
        """The store time for the next records: the clock in ms, never below the last one given
        (store times never go backwards: offset_for_timestamp binary-searches them)."""
        ts = time.time_ns() // 1_000_000
        if ts < self._last_ts:
            ts = self._last_ts
        self._last_ts = ts
        return ts

    def _index_or_take_back(self, topic: str, queue_id: int, first: int, batch: bytearray,
                            starts: Sequence[int], positions: list[int], at: int) -> BaseException | None:
        """Index a batch the log took at `at`. None when indexed; when that fails, the error,
        after the log was cut back to `at` (everything written from there goes) and the index
        to `first`: the log never holds records the index lacks, so the store stays usable (a
        full disk fails this send, and the next one works once there is space again). When the
        taking back fails too, StoreError and the store refuses appends until a restart:
        appending on would hand out these offsets again, and recovery rebuilds the index from
        the log."""
        try:
            self.index.add(topic, queue_id, first, index_entries(batch, starts, positions))
            return None
        except BaseException as e:
            try:
                self.index.truncate(topic, queue_id, first)
                self.log.unwrite(at)
            except BaseException as undo:
                self._broken = undo
                raise StoreError(f"index write failed ({e}) and could not be undone ({undo}); "
                                 "the store needs a restart") from e
            return e

    def wait_flushed(self, end_position: int) -> concurrent.futures.Future:
        return self._flusher.wait(end_position)

    def _flush_to_disk(self) -> int:
        """The flusher thread's job: fsync the log. The index is not fsynced here: what makes a
        send durable is its record in the log (flush=sync answers after this fsync), and recovery
        rebuilds the index entries of every record past the checkpoint from the log (it scans
        from there), so an index write a crash loses costs nothing but that scan. The
        checkpointer fsyncs the index before a checkpoint vouches for it (_checkpoint_round).

        After a failed fsync the checkpoint never again passes the end of the last flush that
        succeeded before it, index included (`_checkpoint_cap`, for the life of this process):
        Linux may drop the dirty pages of a failed fsync and report success on the next one, so a
        later success does not prove the earlier bytes reached the disk. The next open verifies
        everything past the cap (recovery scans from the checkpoint) instead of trusting it."""
        try:
            end = self.log.sync()
        except BaseException:
            self._lower_cap("the commit log")
            raise
        with self._durability_lock:
            self._durable = max(self._durable, min(end, self._checkpoint_cap))
        self.log.sweep_maps()
        return end

    def _lower_cap(self, what: str) -> None:
        """An fsync of `what` failed: below `safe` both the log and the index entries were
        fsynced by flushes that worked, and no checkpoint may pass it from now on."""
        with self._durability_lock:
            safe = min(self._durable, self._index_durable)
            if self._checkpoint_cap > safe:
                log.error("fsync of %s failed: the checkpoint stays at or below position %d from now "
                          "on (the next start verifies the log after it)", what, safe)
            self._checkpoint_cap = min(self._checkpoint_cap, safe)

    def _checkpoint_loop(self) -> None:
        """The checkpointer thread: a round every CHECKPOINT_EVERY_SECONDS until close()."""
        while not self._stop_checkpoints.wait(CHECKPOINT_EVERY_SECONDS):
            try:
                self._checkpoint_round()
            except BaseException as e:  # a round's failure is logged; the next round tries again
                log.error("checkpoint round failed: %s", e)

    def _checkpoint_round(self) -> bool:
        """fsync the index and move the checkpoint to the log's current end; False if nothing was
        new or a flush failed (logged; the checkpoint stays). The queue ends it records are taken
        first, so every entry they count points at a record below the log end it then waits to
        be durable (the flusher's fsync), and is fsynced before the checkpoint vouches for it."""
        with self._round_lock:
            ends = self._index_ends()
            target = self.log.published_end
            if target <= self._checkpointed:
                return False
            try:
                self._flusher.wait(target).result(timeout=60)
            except (StoreError, concurrent.futures.TimeoutError) as e:
                log.warning("checkpoint waits for the log to be flushed: %s", e)
                return False
            try:
                self.index.flush()
            except BaseException:
                self._lower_cap("the queue index")
                raise
            with self._durability_lock:
                self._index_durable = max(self._index_durable, min(target, self._checkpoint_cap))
            try:
                self._write_checkpoint(target, ends)
            except OSError as e:  # the data is durable; an old checkpoint only costs recovery time
                log.warning("could not write the checkpoint (%s); it stays at %d", e, self._checkpointed)
                return False
            return True

    def _index_ends(self) -> dict[tuple[str, int], int]:
        return self.index.ends()

    def _write_checkpoint(self, end: int, ends: dict[tuple[str, int], int] | None = None) -> None:
        """Vouch for the log below end and for each queue's index up to its end in `ends`."""
        with self._checkpoint_lock:
            # never past the log's end now: a replica's truncate_log may have cut the log since
            # the checkpoint round took `end` and `ends`
            with self._durability_lock:
                cap = self._checkpoint_cap
            end = min(end, cap, self.log.published_end)
            if end < self._checkpointed:
                return
            now = self._index_ends()
            ends = now if ends is None else {k: min(v, now.get(k, v)) for k, v in ends.items()}
            write_atomic(os.path.join(self.data_dir, CHECKPOINT), pack_checkpoint(end, ends))
            self._checkpointed = end

    def flush(self) -> None:
        """Make everything appended so far durable before returning. It fsyncs on the calling
        thread, so the broker calls it from an executor or at shutdown, never on its event loop."""
        self.log.sync()
        self.index.flush()

    def prepare_queues(self, topic: str, queue_ids: Iterable[int]) -> int:
        """(a worker thread, alongside appends) Create each new queue's index directory and first
        index file ahead of its first append (FileQueueIndex.prepare; equeue_core/queue_prep.py)."""
        return self.index.prepare(topic, queue_ids)

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
        """Records from offset on. Those below `_verified_from` are checked on this read
        (record.damage: size, magic, lengths, crc, and the position its index entry names); those
        at or past it were verified once in this process and are served without a second crc (see
        the module docstring). A damaged record ends the pull before it; a pull that starts at it
        raises CorruptRecordError naming its place."""
        lo, hi = self._range(topic, queue_id)
        if offset == hi:
            return PullResult(b"", 0, offset, lo, hi)
        if offset < lo or offset > hi:
            raise OffsetOutOfRangeError(f"offset {offset} of {topic}/{queue_id} is outside [{lo}, {hi}]",
                                        min_offset=lo, max_offset=hi)
        scan = max_count if tag_hashes is None else max(max_count, _SCAN_WITH_FILTER)
        entries = self.index.read(topic, queue_id, offset, min(scan, hi - offset))
        runs, count, scanned = index_runs(entries, max_count, max_bytes, tag_hashes)
        if runs and runs[0][0] < self._verified_from:  # (ascending: a queue's records are)
            return self._verified(topic, queue_id, offset, entries, tag_hashes, runs, count,
                                  offset + scanned, lo, hi)
        records = self._read_runs(runs)
        if records is None:  # deleted by retention meanwhile
            lo = self._range(topic, queue_id)[0]
            raise OffsetOutOfRangeError(f"offset {offset} of {topic}/{queue_id} was deleted",
                                        min_offset=lo, max_offset=hi)
        return PullResult(records, count, offset + scanned, lo, hi)

    def _read_runs(self, runs: list[tuple[int, int]]) -> bytes | None:
        """The bytes of a pull's runs joined, None if one is no longer stored. Several runs (a
        queue among many topics' records) in one copy, out of the ring where it holds them and
        the mapped chunks before that (CommitLog.read_runs); one run, or runs whose chunks
        cannot be mapped, one by one (`read`, which preads when it must)."""
        if len(runs) > 1:
            records = self.log.read_runs(runs)
            if records is not None:
                return records
        parts = []
        for a, b in runs:
            data = self.log.read(a, b)
            if data is None:
                return None
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _verified(self, topic: str, queue_id: int, offset: int, entries: memoryview,
                  tag_hashes: frozenset[int] | None, runs: list[tuple[int, int]],
                  count: int, next_offset: int, lo: int, hi: int) -> PullResult:
        """read_queue for a pull that reaches below _verified_from: check every record
        (record.damage's checks), serve the intact ones before the first damaged one, or raise
        CorruptRecordError when that is the first.

        A pull of VERIFY_AT_ONCE records or more is read in one copy and checked all at once
        (export.first_damaged: vectorised, one batched crc call). Only when that finds a damaged
        record, or the runs cannot be read in one copy, does it go record by record, re-reading
        a record that fails in a ring copy from its chunk file before calling it damaged. Why:
        after a restart everything written before it lies below _verified_from, and record by
        record a consumer catching up drained at a third of its rate (docs/benchmarks.md, "A
        pull's runs out of the mapped chunks in one copy")."""
        if count >= VERIFY_AT_ONCE:
            data = self._read_runs(runs)
            if data is not None and _all_intact(data, entries, tag_hashes, count):
                return PullResult(data, count, next_offset, lo, hi)
        picked: list[tuple[int, int, int]] = []  # (queue offset, position, size) of served entries
        for i, (pos, size, th) in enumerate(INDEX_ENTRY.iter_unpack(entries)):
            if len(picked) == count:
                break
            if tag_hashes is None or th in tag_hashes:
                picked.append((offset + i, pos, size))
        bounds = []  # (first, last) index into picked of each run's records: the runs' own rule
        run_end = -1
        for j, (_q, pos, size) in enumerate(picked):
            if pos == run_end and bounds:
                bounds[-1][1] = j + 1
            else:
                bounds.append([j, j + 1])
            run_end = pos + size
        out = []
        for r, (a, b) in enumerate(runs):
            data = self.log.read(a, b)
            k, last = bounds[r]
            bad = None if data is None else _first_damaged(data, a, picked, k, last)
            if bad is not None:  # a ring copy may have lost a race: judge by the chunk file alone
                data = self.log.read_file(a, b)
                bad = None if data is None else _first_damaged(data, a, picked, k, last)
            if data is None:  # deleted by retention meanwhile
                lo = self._range(topic, queue_id)[0]
                raise OffsetOutOfRangeError(f"offset {offset} of {topic}/{queue_id} was deleted",
                                            min_offset=lo, max_offset=hi)
            if bad is not None:
                qoff, pos, size = picked[bad]
                if bad == 0:
                    raise corrupt_record(topic, queue_id, qoff, pos, damage(data, pos - a, size, pos) or "damaged")
                out.append(memoryview(data)[:pos - a])
                return PullResult(b"".join(out), bad, qoff, lo, hi)
            out.append(data)
        records = out[0] if len(out) == 1 else b"".join(out)
        return PullResult(records, count, next_offset, lo, hi)

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
        self._stop_checkpoints.set()
        self._checkpointer.join()
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
