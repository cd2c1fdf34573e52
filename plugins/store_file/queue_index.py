"""Per-queue index files: queue offset -> (position, size, tag hash), 20 bytes per entry.

Layout (docs/format.md, "Index files"): <data_dir>/index/<topic>/<queue_id>/<first offset>, each
file holding `index_file_entries` packed record.INDEX_ENTRY entries, so offset n lives in file
n // entries_per_file * entries_per_file at byte (n % entries_per_file) * 20. No checksum: the index
is rebuilt from the commit log after a crash (Kafka's OffsetIndex makes the same trade), and a file
whose length is not a multiple of 20 loses its torn last entry on open.

Appends come from one writer thread; reads (os.pread) and flush (the flusher thread) may run on
other threads. The index may run ahead of the durable log after a crash; the message store that
owns it truncates it back in its recovery (see FileQueueIndex.truncate).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from equeue_core.contracts import StoreSettings
from equeue_core.errors import StoreError
from equeue_core.record import INDEX_ENTRY_SIZE

from .atomic import fsync_dir, write_all
from .constants import DEFAULT_INDEX_FILE_ENTRIES, INDEX_DIR, file_name, parse_file_name
from .store_info import load_store_info

log = logging.getLogger(__name__)

_EMPTY = memoryview(b"")
# A queue keeps the entries of its last add in memory when it added at most this many (a one-by-one
# sender's); bigger batches are read back with a pread like the rest (bounded memory per queue).
TAIL_ENTRIES = 32
_RETIRE_SECONDS = 30.0


def queue_dir(root: str, topic: str, queue_id: int) -> str:
    """The directory of one queue's index files; refuses names that would leave the index root."""
    if not topic or topic in (".", "..") or "/" in topic or "\\" in topic or "\0" in topic:
        raise StoreError(f"topic name {topic!r} cannot be stored as a directory")
    return os.path.join(root, topic, str(int(queue_id)))


@dataclass(slots=True)
class _Queue:
    """One queue's index files. `files` are the first offsets of the files present, ascending."""

    path: str
    files: list[int]
    min_offset: int
    end: int                       # one past the last entry written
    fd: int = -1                   # write fd of the newest file (writer only)
    fd_first: int = -1             # first offset of the file fd points at
    sealed: list[int] = field(default_factory=list)   # older write fds awaiting a last fsync
    read_fds: dict[int, int] = field(default_factory=dict)
    dirty: bool = False            # written since the flusher last fsynced it
    # (first offset, entries) of the last small add: a pull that follows the writer (a held pull
    # woken by that very append) reads its entries here instead of with a pread
    tail: tuple[int, bytes] | None = None


class FileQueueIndex:
    """The file store's QueueIndex (contracts.QueueIndex), plus truncate/set_min for recovery and
    retention. With read_only=True (a reader in another process) it never writes or truncates and
    re-lists a queue's files when asked for offsets it has not seen yet."""

    def __init__(self, settings: StoreSettings, read_only: bool = False) -> None:
        self.root = os.path.join(settings.data_dir, INDEX_DIR)
        info = load_store_info(settings.data_dir)
        opt = settings.options.get("index_file_entries")
        if info is not None:
            self.entries_per_file = int(info["index_file_entries"])
        else:
            self.entries_per_file = int(opt) if opt else DEFAULT_INDEX_FILE_ENTRIES
        if self.entries_per_file <= 0:
            raise StoreError("index_file_entries must be positive")
        self.read_only = read_only
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._retired: list[tuple[float, int]] = []   # read fds of deleted files, closed later
        self._dirs_to_sync: set[str] = set()
        self._prepared: set[str] = set()  # queue directories prepare() made, not used yet
        self._lock = threading.Lock()
        self._closed = False
        if not read_only:
            os.makedirs(self.root, exist_ok=True)
        self._load_all()

    # ------------------------------------------------------------ loading
    def _load_all(self) -> None:
        if not os.path.isdir(self.root):
            return
        for topic in sorted(os.listdir(self.root)):
            tdir = os.path.join(self.root, topic)
            if not os.path.isdir(tdir):
                continue
            for qname in os.listdir(tdir):
                if qname.isdigit():
                    q = self._load_queue(topic, int(qname))
                    if q is not None:
                        self._queues[(topic, int(qname))] = q

    def _load_queue(self, topic: str, queue_id: int) -> _Queue | None:
        path = queue_dir(self.root, topic, queue_id)
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            return None
        files = sorted(n for n in (parse_file_name(x) for x in names) if n is not None)
        if not files:
            return _Queue(path, [], 0, 0)
        last = files[-1]
        size = os.path.getsize(os.path.join(path, file_name(last)))
        if size % INDEX_ENTRY_SIZE and not self.read_only:
            log.warning("index %s/%s: dropping a torn entry (%d trailing bytes)",
                        path, file_name(last), size % INDEX_ENTRY_SIZE)
            os.truncate(os.path.join(path, file_name(last)), size - size % INDEX_ENTRY_SIZE)
        end = last + min(size // INDEX_ENTRY_SIZE, self.entries_per_file)
        return _Queue(path, files, files[0], end)

    def _queue(self, topic: str, queue_id: int, create: bool) -> _Queue | None:
        q = self._queues.get((topic, queue_id))
        if q is None:
            if self.read_only:
                q = self._load_queue(topic, queue_id)
                if q is not None:
                    self._queues[(topic, queue_id)] = q
                return q
            if not create:
                return None
            path = queue_dir(self.root, topic, queue_id)
            prepared = path in self._prepared  # by prepare(): its directory and empty file 0 are there
            if prepared:
                self._prepared.discard(path)
                self._dirs_to_sync.add(path)  # file 0's entry: _roll() into it adds none
            else:
                os.makedirs(path, exist_ok=True)
            self._dirs_to_sync.add(os.path.dirname(path))
            self._dirs_to_sync.add(self.root)
            q = _Queue(path, [0] if prepared else [], 0, 0)
            self._queues[(topic, queue_id)] = q
        return q

    def prepare(self, topic: str, queue_ids: Iterable[int]) -> int:
        """(any thread, alongside the writer) Create the directory and first index file of each
        queue this index has not seen, so that the queue's first add() only opens an existing
        file: a file's creation waits for the file system's journal, ~0.4 ms each for the
        directory and the file on a disk busy with the log's fsyncs, and add() runs on the
        broker's loop thread (docs/benchmarks.md, "A queue's first write off the loop"). Returns
        how many queues it prepared.

        Only ever a head start: it never changes what add() or a read sees (no entry, no state
        but `_prepared`, which only lets add() skip its makedirs), and an add() that comes first
        creates the same directory and file itself (O_CREAT without O_TRUNC on both sides). A
        prepared file is empty, so a reopened store loads such a queue as one with no entries
        whose first add() starts it (at 0, or where a replica's first copied run starts).
        Nothing is fsynced here: a lost prepared file is made again by the first add(), which
        has its directories fsynced as before."""
        if self.read_only or self._closed:
            return 0
        made = 0
        for queue_id in queue_ids:
            if (topic, queue_id) in self._queues:
                continue
            path = queue_dir(self.root, topic, queue_id)
            os.makedirs(path, exist_ok=True)
            os.close(os.open(os.path.join(path, file_name(0)), os.O_WRONLY | os.O_CREAT, 0o644))
            self._prepared.add(path)
            made += 1
        return made

    # ------------------------------------------------------------ writing
    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None:
        """Append entries for offsets first_offset.. ; first_offset must be the queue's end."""
        if self.read_only:
            raise StoreError("index opened read-only")
        q = self._queues.get((topic, queue_id)) or self._queue(topic, queue_id, True)
        assert q is not None
        if first_offset != q.end:
            if q.end == 0 and (not q.files or q.files == [0]):
                # no entry yet (no file, or prepare()'s empty one): start where the first add
                # says (a queue whose first offsets were deleted, a replica's first copied run)
                if q.files and first_offset >= self.entries_per_file:
                    self._drop_empty_first(q)
                q.min_offset = q.end = first_offset
            else:
                raise StoreError(f"index {topic}/{queue_id}: append at {first_offset}, end is {q.end}")
        n = len(entries) // INDEX_ENTRY_SIZE
        per = self.entries_per_file
        if q.fd >= 0 and q.end + n <= q.fd_first + per:  # the common case: one write, no roll
            write_all(q.fd, entries)
            q.tail = (q.end, bytes(entries)) if n <= TAIL_ENTRIES else None
            q.end += n
            q.dirty = True
            return
        q.tail = None
        mv = memoryview(entries)
        done = 0
        while done < n:
            off = q.end
            if q.fd < 0 or off >= q.fd_first + per:
                self._roll(q, off - off % per)
            take = min(n - done, q.fd_first + per - off)
            write_all(q.fd, mv[done * INDEX_ENTRY_SIZE:(done + take) * INDEX_ENTRY_SIZE])
            done += take
            q.end += take
        q.dirty = True

    def _drop_empty_first(self, q: _Queue) -> None:
        """Remove a queue's empty file 0 before it starts past that file: left in place, it would
        read as a hole below the queue's entries at the next open."""
        self._close_write(q)
        self._close_read(q, 0)
        try:
            os.unlink(os.path.join(q.path, file_name(0)))
        except FileNotFoundError:
            pass
        q.files = []
        self._dirs_to_sync.add(q.path)

    def _roll(self, q: _Queue, first: int) -> None:
        """Open (creating if needed) the index file starting at `first` for appending."""
        fd = os.open(os.path.join(q.path, file_name(first)), os.O_WRONLY | os.O_CREAT, 0o644)
        os.lseek(fd, (q.end - first) * INDEX_ENTRY_SIZE, os.SEEK_SET)
        with self._lock:
            if q.fd >= 0:
                q.sealed.append(q.fd)
            q.fd, q.fd_first = fd, first
            if not q.files or q.files[-1] != first:
                q.files.append(first)
                self._dirs_to_sync.add(q.path)

    def truncate(self, topic: str, queue_id: int, offset: int) -> int:
        """Drop entries at and past offset (recovery: they point past the valid log; append: a
        failed write is taken back, bytes of a partial entry included). Returns how many whole
        entries were dropped."""
        q = self._queue(topic, queue_id, False)
        if q is None or offset > q.end or (offset == q.end and q.fd < 0):
            return 0
        offset = max(offset, q.min_offset)
        dropped = q.end - offset
        self._close_write(q)
        containing = offset - offset % self.entries_per_file
        for first in [f for f in q.files if f > containing]:
            self._close_read(q, first)
            os.unlink(os.path.join(q.path, file_name(first)))
            q.files.remove(first)
        if containing in q.files:
            os.truncate(os.path.join(q.path, file_name(containing)), (offset - containing) * INDEX_ENTRY_SIZE)
        q.end = offset
        q.tail = None
        self._dirs_to_sync.add(q.path)
        return dropped

    def reset(self, topic: str, queue_id: int, first_offset: int) -> None:
        """Recovery: delete every index file of a queue; its next add() starts at first_offset."""
        q = self._queue(topic, queue_id, True)
        assert q is not None
        self._close_write(q)
        for first in list(q.files):
            self._close_read(q, first)
            try:
                os.unlink(os.path.join(q.path, file_name(first)))
            except FileNotFoundError:
                pass
        q.files = []
        q.tail = None
        q.min_offset = q.end = first_offset
        self._dirs_to_sync.add(q.path)

    def first_hole(self, topic: str, queue_id: int) -> int | None:
        """The first offset below the queue's end that has no entry on disk (a missing or short
        index file before the newest one), or None. Costs a stat per file, no reads."""
        q = self._queue(topic, queue_id, False)
        if q is None:
            return None
        per = self.entries_per_file
        for i, first in enumerate(q.files[:-1]):
            size = os.path.getsize(os.path.join(q.path, file_name(first)))
            if size < per * INDEX_ENTRY_SIZE:
                return first + size // INDEX_ENTRY_SIZE
            if q.files[i + 1] != first + per:
                return first + per
        return None

    def ends(self) -> dict[tuple[str, int], int]:
        """Every queue's end (one past its last entry written); safe from any thread."""
        return {key: q.end for key, q in list(self._queues.items())}

    def set_min(self, topic: str, queue_id: int, offset: int) -> None:
        """Retention: offsets below `offset` are gone; delete the index files wholly below it."""
        q = self._queue(topic, queue_id, False)
        if q is None or offset <= q.min_offset:
            return
        offset = min(offset, q.end)
        q.min_offset = offset
        per = self.entries_per_file
        # the newest file always stays: it is what tells the next open where the queue ends
        for first in [f for f in q.files[:-1] if f + per <= offset and f != q.fd_first]:
            self._close_read(q, first)
            try:
                os.unlink(os.path.join(q.path, file_name(first)))
            except FileNotFoundError:
                pass
            q.files.remove(first)

    # ------------------------------------------------------------ reading
    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> memoryview:
        """Packed entries for offset.. (at most max_count, fewer at the end or a missing file)."""
        q = self._queues.get((topic, queue_id)) or self._queue(topic, queue_id, False)
        if q is None:
            return _EMPTY
        if self.read_only and offset + max_count > q.end:
            self._refresh(topic, queue_id, q)
        count = min(max_count, q.end - offset)
        if count <= 0 or offset < q.min_offset:
            return _EMPTY
        tail = q.tail
        if tail is not None and tail[0] <= offset and offset + count <= q.end:
            start = (offset - tail[0]) * INDEX_ENTRY_SIZE
            return memoryview(tail[1])[start:start + count * INDEX_ENTRY_SIZE]
        per = self.entries_per_file
        parts = []
        while count > 0:
            first = offset - offset % per
            take = min(count, first + per - offset)
            fd = q.read_fds.get(first)
            if fd is None:
                try:
                    fd = os.open(os.path.join(q.path, file_name(first)), os.O_RDONLY)
                except FileNotFoundError:
                    break
                kept = q.read_fds.setdefault(first, fd)
                if kept != fd:  # another thread opened it first
                    os.close(fd)
                    fd = kept
            want = take * INDEX_ENTRY_SIZE
            data = os.pread(fd, want, (offset - first) * INDEX_ENTRY_SIZE)
            if len(data) % INDEX_ENTRY_SIZE:
                data = data[:len(data) - len(data) % INDEX_ENTRY_SIZE]
            parts.append(data)
            if len(data) < want:
                break
            offset += take
            count -= take
        if len(parts) == 1:
            return memoryview(parts[0])
        return memoryview(b"".join(parts))

    def _refresh(self, topic: str, queue_id: int, q: _Queue) -> None:
        fresh = self._load_queue(topic, queue_id)
        if fresh is not None:
            q.files, q.end = fresh.files, fresh.end
            q.min_offset = max(q.min_offset, fresh.min_offset)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        q = self._queues.get((topic, queue_id)) or self._queue(topic, queue_id, False)
        if q is None:
            return (0, 0)
        if self.read_only:
            self._refresh(topic, queue_id, q)
        return (q.min_offset, q.end)

    def queues(self) -> dict[str, list[int]]:
        """Every queue that has held an entry. A queue prepare() made that was never written is
        left out, so the queues listed are those appends made, whether or not the broker
        prepared them (a master and its replica list the same)."""
        if self.read_only:
            self._load_all_new()
        out: dict[str, list[int]] = {}
        for (topic, qid), q in sorted(self._queues.items()):
            if q.end or q.min_offset or (q.files and q.files != [0]):
                out.setdefault(topic, []).append(qid)
        return out

    def _load_all_new(self) -> None:
        if not os.path.isdir(self.root):
            return
        for topic in os.listdir(self.root):
            tdir = os.path.join(self.root, topic)
            if os.path.isdir(tdir):
                for qname in os.listdir(tdir):
                    if qname.isdigit() and (topic, int(qname)) not in self._queues:
                        q = self._load_queue(topic, int(qname))
                        if q is not None:
                            self._queues[(topic, int(qname))] = q

    # ------------------------------------------------------------ durability
    def flush(self) -> None:
        """fsync every index file written since the last flush (runs on the file store's checkpointer thread, and at close)."""
        if self.read_only or self._closed:
            return
        with self._lock:
            dirs, self._dirs_to_sync = self._dirs_to_sync, set()
            work = []
            for q in list(self._queues.values()):
                if q.dirty or q.sealed:
                    # cleared before the fsync: a write racing with it sets it again afterwards
                    q.dirty = False
                    sealed, q.sealed = q.sealed, []
                    work.append((q, q.fd, sealed))
        for i, (_q, fd, sealed) in enumerate(work):
            try:
                while sealed:
                    os.fdatasync(sealed[0])
                    os.close(sealed.pop(0))
                if fd >= 0:
                    try:
                        os.fdatasync(fd)
                    except OSError as e:
                        # EBADF: closed by truncate/reset in the meantime, which fsynced it. Any
                        # other error (EIO, ENOSPC) must reach the checkpoint round, so no checkpoint
                        # vouches for these entries.
                        if e.errno != errno.EBADF:
                            raise
            except BaseException:
                with self._lock:  # what was not made durable is still to do next time
                    self._dirs_to_sync |= dirs
                    for q2, _fd, rest in work[i:]:
                        q2.dirty = True
                        q2.sealed[:0] = rest
                raise
        for d in dirs:
            _fsync_dir(d)

    def sync_all(self) -> None:
        """fsync the two newest files of every queue and every index directory: after a crash,
        entries the dead writer left in the page cache were never fsynced."""
        for q in list(self._queues.values()):
            for first in q.files[-2:]:
                fd = os.open(os.path.join(q.path, file_name(first)), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fsync_dir(q.path)
            _fsync_dir(os.path.dirname(q.path))
        _fsync_dir(self.root)
        self.flush()

    def _close_write(self, q: _Queue) -> None:
        with self._lock:
            fds = q.sealed + ([q.fd] if q.fd >= 0 else [])
            q.sealed, q.fd, q.fd_first = [], -1, -1
        for fd in fds:
            try:
                os.fdatasync(fd)
            except OSError as e:
                # a descriptor that is gone (EBADF) or cannot be synced (EINVAL) has nothing we
                # could make durable; any other error (EIO) is the caller's to handle
                if e.errno not in (errno.EBADF, errno.EINVAL):
                    raise
            finally:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _close_read(self, q: _Queue, first: int) -> None:
        """Retire a read fd; it is closed a while later, so a thread in the middle of a pread on
        it never reads from a reused fd number."""
        fd = q.read_fds.pop(first, None)
        now = time.monotonic()
        if fd is not None:
            self._retired.append((now, fd))
        keep = []
        for t, old in self._retired:
            if now - t > _RETIRE_SECONDS or self._closed:
                os.close(old)
            else:
                keep.append((t, old))
        self._retired = keep

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        for q in self._queues.values():
            if not self.read_only:
                self._close_write(q)
            for first in list(q.read_fds):
                self._close_read(q, first)
        for _, fd in self._retired:
            os.close(fd)
        self._retired = []


def _fsync_dir(path: str) -> None:
    """fsync_dir, for a directory that may be gone (a queue's, after a reset) by now."""
    try:
        fsync_dir(path)
    except FileNotFoundError:
        pass
