"""The commit log: every record of every queue, appended by one writer into fixed-size chunks.

A position is a byte offset in the log; chunk files are named by their start position (a multiple
of chunk_size), so position p lives in chunk p - p % chunk_size at offset p % chunk_size. A batch is
never split across chunks: when it does not fit before chunk_size - END_OF_CHUNK_SIZE, the writer
writes the end-of-chunk marker after the last record and continues at the next chunk's start.
docs/format.md has the byte grammar.

Threads: reserve()/write()/publish() run on the writer thread only; read() on any thread; sync() on
the flusher thread. A lock guards only the rare structural changes (roll, delete, map bookkeeping).

The chunk being written is longer than its records: the writer sets its length up to LENGTH_AHEAD
bytes past them (the bytes between are zero), so an append changes no file length and the
fdatasync that makes it durable has no inode to write. A roll cuts the sealed chunk to its last
record and marker, a clean close cuts the chunk being written, and recovery cuts the zero tail a
crash leaves (not counted as torn data). So a chunk at rest is exactly as long as its records.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from operator import itemgetter

from equeue_core.errors import InvalidMessageError, StoreError

from .chunk import MappedChunk, pread_exact
from .constants import (
    END_OF_CHUNK,
    END_OF_CHUNK_SIZE,
    LENGTH_AHEAD,
    MAP_IDLE_SECONDS,
    RING_PAGE,
    file_name,
    parse_file_name,
)
from .ring import Ring

log = logging.getLogger(__name__)


def list_chunks(log_dir: str) -> list[int]:
    """Start positions of the chunk files present, ascending."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in (parse_file_name(x) for x in names) if n is not None)


class CommitLog:
    def __init__(self, log_dir: str, chunk_size: int, ring_bytes: int, map_low: int, map_high: int,
                 map_idle_seconds: float = MAP_IDLE_SECONDS) -> None:
        self.dir = log_dir
        self.chunk_size = chunk_size
        self.ring = Ring(ring_bytes)
        self.map_low = map_low
        self.map_high = map_high
        self.map_idle_seconds = map_idle_seconds
        self.chunks: list[int] = list_chunks(log_dir)
        self._maps: dict[int, MappedChunk] = {}
        self._lock = threading.Lock()
        self._fd = -1
        self._length = 0                  # the length of the chunk file being written (>= its records)
        self._sealed: list[int] = []      # write fds of rolled chunks, closed after their last fsync
        self._sync_dir = False
        self.write_pos = 0                # where the next record goes
        self.published_end = 0            # end of data whose index entries are written too
        self._last_sweep = 0.0

    # ------------------------------------------------------------ writer
    def path(self, start: int) -> str:
        return os.path.join(self.dir, file_name(start))

    def open_for_write(self, end: int) -> None:
        """Start appending at `end` (recovery has truncated the log there)."""
        cs = self.chunk_size
        start = end - end % cs
        self._fd = os.open(self.path(start), os.O_WRONLY | os.O_CREAT, 0o644)
        os.lseek(self._fd, end - start, os.SEEK_SET)
        self._length = os.fstat(self._fd).st_size
        if start not in self.chunks:
            self.chunks.append(start)
            self.chunks.sort()
            self._sync_dir = True
        self.write_pos = self.published_end = end

    def reserve(self, n: int) -> int:
        """The position a batch of n bytes will be written at, rolling to a new chunk if needed."""
        pos = self.write_pos
        cs = self.chunk_size
        if pos % cs + n > cs - END_OF_CHUNK_SIZE:
            if n > cs - END_OF_CHUNK_SIZE:
                raise InvalidMessageError(f"a batch of {n} bytes does not fit in a chunk of {cs} bytes")
            pos = self._roll()
        return pos

    def _roll(self) -> int:
        """Seal the current chunk with the end-of-chunk marker, cut right after it (before a
        reader can see the next chunk: replica_log takes a sealed chunk's length as its end), and
        open the next one."""
        self._write(END_OF_CHUNK)
        cs = self.chunk_size
        self._set_length(self.write_pos % cs + END_OF_CHUNK_SIZE)
        start = self.write_pos - self.write_pos % cs + cs
        fd = os.open(self.path(start), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with self._lock:
            self._sealed.append(self._fd)
            self._fd = fd
            self._length = 0
            self.chunks.append(start)
            self._sync_dir = True
        self.write_pos = start
        return start

    def _set_length(self, length: int) -> None:
        os.ftruncate(self._fd, length)
        self._length = length

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            end = self.write_pos % self.chunk_size + len(data)
            if end > self._length:  # zero bytes ahead of the records (module docstring)
                ahead = (end + LENGTH_AHEAD + 4095) // 4096 * 4096  # rounded up to a page
                self._set_length(min(self.chunk_size, ahead))
            n = os.write(self._fd, data)  # the usual case: the kernel takes it all in one write
            if n == len(data):
                return
            mv = memoryview(data)[n:]
            while mv:
                mv = mv[os.write(self._fd, mv):]
        except OSError as e:  # disk full: cut the partial record off so the log stays a clean prefix
            cut = self.write_pos % self.chunk_size
            try:
                self._set_length(cut)
                os.lseek(self._fd, cut, os.SEEK_SET)
            except OSError:
                log.exception("could not cut a partial write off the commit log")
            raise StoreError(f"commit log write failed: {e}") from e

    def write(self, batch: bytes | bytearray, position: int) -> int:
        """Write a stamped batch at `position` (from reserve) with one write; returns its end."""
        self._write(batch)
        self.ring.write(position, batch)
        end = position + len(batch)
        self.write_pos = end
        return end

    def write_many(self, batches: Sequence[bytearray], position: int) -> int:
        """Write stamped batches back to back at `position` (from reserve, for their total) as
        `write` writes one, joined first: one write(2) and one ring copy for a SEND_MULTI's
        sections (a `writev` and a ring copy per section measured the same, with more code).
        Returns their end; on failure nothing is written (StoreError)."""
        return self.write(batches[0] if len(batches) == 1 else b"".join(batches), position)

    def unwrite(self, position: int) -> None:
        """Take back the last write (it started at `position`, nothing was published after it):
        cut the file there; the next reserve() hands out `position` again. Writer thread only."""
        cs = self.chunk_size
        self._set_length(position % cs)
        os.lseek(self._fd, position % cs, os.SEEK_SET)
        self.write_pos = position

    def seal_chunk(self) -> int:
        """Seal the current chunk here and continue at the next chunk's start (a replica copying
        its master's roll, see replica_log.py). Writer thread only; returns the new position."""
        return self._roll()

    def truncate_files(self, position: int) -> None:
        """Cut the log at position: the chunk holding it is cut there, later chunks deleted, both
        made durable (file and directory fsync); the writer continues at position. Writer thread
        only, with nothing published past position any more (readers no longer ask for it)."""
        cs = self.chunk_size
        cstart = position - position % cs
        with self._lock:
            fds = self._sealed + ([self._fd] if self._fd >= 0 else [])
            self._sealed, self._fd = [], -1
            for c in [c for c in self._maps if c >= cstart]:
                self._maps.pop(c).unmap()
            doomed = [c for c in self.chunks if c > cstart]
            self.chunks = [c for c in self.chunks if c <= cstart]
        for fd in fds:
            os.close(fd)
        self.ring.clear()
        for c in doomed:
            try:
                os.unlink(self.path(c))
            except FileNotFoundError:
                pass
        fd = os.open(self.path(cstart), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, position - cstart)
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.open_for_write(position)

    def publish(self, end: int) -> None:
        """Everything below end is written and indexed: the flusher may make it durable."""
        self.published_end = end

    # ------------------------------------------------------------ flusher thread
    def sync(self) -> int:
        """fsync everything published so far; returns that end position."""
        with self._lock:
            end = self.published_end
            fd = self._fd
            sealed, self._sealed = self._sealed, []
            sync_dir, self._sync_dir = self._sync_dir, False
        try:
            while sealed:
                os.fdatasync(sealed[0])
                os.close(sealed.pop(0))
            if fd >= 0:
                os.fdatasync(fd)
            if sync_dir:
                dfd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except BaseException:
            with self._lock:  # still to do: the next sync tries them again
                self._sealed[:0] = sealed
                self._sync_dir = self._sync_dir or sync_dir
            raise
        return end

    def sync_range(self, start: int, end: int) -> None:
        """fsync every chunk holding positions [start, end) (recovery, before a new checkpoint)."""
        cs = self.chunk_size
        for c in self.chunks:
            if c + cs > start and c < max(end, start + 1):
                fd = os.open(self.path(c), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    # ------------------------------------------------------------ readers (any thread)
    @property
    def start(self) -> int:
        """The first position still stored."""
        chunks = self.chunks
        return chunks[0] if chunks else self.write_pos

    def read(self, start: int, end: int) -> bytes | None:
        """Bytes of positions [start, end) (within one chunk); None if not stored (deleted)."""
        data = self.ring.read(start, end)
        if data is not None:
            return data
        return self.read_file(start, end)

    def read_runs(self, runs: Sequence[tuple[int, int]]) -> bytes | None:
        """The bytes of every span of `runs` (ascending, each within one chunk) joined, copied
        once: the spans the ring may still hold (the newest `ring.size` bytes) out of it in one
        gather, the older ones sliced straight out of the mapped chunks (the ring's part, when
        there are both, is copied a second time in the join). None if a chunk they lie in cannot
        be mapped (deleted by retention, or the maps are at their high watermark): read them one
        by one then (`read`, which preads).

        Why: over many topics a queue's records lie in the log in runs. Read one by one, each
        run cost a ring try, a map lookup and a copy of its own, and the join copied them all
        again (docs/benchmarks.md, "A pull's runs out of the mapped chunks in one copy"). The
        ring is still read where it holds the spans: slicing the chunks there would map pages
        the ring spares the reader (the broker's RSS grew by the ring's size)."""
        ring = self.ring
        oldest_held = (self.write_pos // RING_PAGE - ring.pages + 1) * RING_PAGE  # (once it has lapped)
        k = bisect_left(runs, oldest_held, key=itemgetter(0))
        newest = None
        if k < len(runs):
            newest = ring.read_runs(runs[k:] if k else runs)
            if newest is None:  # lapped meanwhile (or never written there): the chunks
                k = len(runs)
            elif not k:
                return newest
        parts = self._chunk_views(runs[:k])
        if parts is None:
            return None
        if newest is not None:
            parts.append(newest)
        return b"".join(parts)

    def _chunk_views(self, runs: Sequence[tuple[int, int]]) -> list | None:
        """Views of the spans `runs` in the mapped chunks (no copy yet), or None if a chunk they
        lie in cannot be mapped."""
        cs = self.chunk_size
        maps = self._maps
        parts: list = []
        view: memoryview | None = None
        base = -1
        i, n = 0, len(runs)
        while i < n:
            cstart = runs[i][0] - runs[i][0] % cs
            j = i + 1  # the runs in this chunk: runs[i:j]
            while j < n and runs[j][0] - cstart < cs:
                j += 1
            if cstart != base:
                m = maps.get(cstart)
                if m is None and cstart in self.chunks:
                    m = self._new_map(cstart)
                view = m.view(runs[j - 1][1] - cstart) if m is not None else None
                if view is None:
                    return None
                base = cstart
            assert view is not None
            parts += [view[a - cstart:b - cstart] for a, b in runs[i:j]]
            i = j
        return parts

    def read_file(self, start: int, end: int) -> bytes | None:
        """Like read(), but from the chunk file (mmap or pread), never the ring."""
        cs = self.chunk_size
        cstart = start - start % cs
        m = self._maps.get(cstart)
        if m is None:
            if cstart not in self.chunks:  # deleted by retention (or never written)
                return None
            m = self._new_map(cstart)
            if m is None:
                return pread_exact(self.path(cstart), start - cstart, end - start)
        return m.read(start - cstart, end - cstart)

    def _new_map(self, cstart: int) -> MappedChunk | None:
        """A mapping for a chunk, or None above the high watermark (the caller preads)."""
        with self._lock:
            m = self._maps.get(cstart)
            if m is not None:
                return m
            self._sweep_locked()
            if sum(x.mapped_bytes for x in self._maps.values()) >= self.map_high:
                return None
            m = self._maps[cstart] = MappedChunk(cstart, self.path(cstart))
            return m

    def sweep_maps(self) -> None:
        """Unmap idle chunks if above the low watermark (the flusher calls this periodically)."""
        with self._lock:
            self._sweep_locked()

    def _sweep_locked(self) -> None:
        """Above the low watermark, unmap chunks no one read for map_idle_seconds."""
        now = time.monotonic()
        if now - self._last_sweep < min(1.0, self.map_idle_seconds):
            return
        self._last_sweep = now
        total = sum(x.mapped_bytes for x in self._maps.values())
        if total <= self.map_low:
            return
        for cstart, m in sorted(self._maps.items(), key=lambda kv: kv[1].last_used):
            if total <= self.map_low:
                break
            if now - m.last_used > self.map_idle_seconds:
                total -= m.unmap()
                del self._maps[cstart]

    def mapped_bytes(self) -> int:
        return sum(x.mapped_bytes for x in self._maps.values())

    # ------------------------------------------------------------ retention / shutdown
    def delete_before(self, position: int) -> int:
        """Delete every chunk lying wholly below position (never the one being written)."""
        cs = self.chunk_size
        active = self.write_pos - self.write_pos % cs
        released = 0
        with self._lock:
            doomed = [c for c in self.chunks if c + cs <= position and c < active]
            for c in doomed:
                m = self._maps.pop(c, None)
                if m is not None:
                    m.unmap()
                try:
                    released += os.path.getsize(self.path(c))
                    os.unlink(self.path(c))
                except FileNotFoundError:
                    pass
            self.chunks = [c for c in self.chunks if c not in doomed]
            if doomed:
                self._sync_dir = True
        return released

    def close(self) -> None:
        """Close the files, the chunk being written cut to its records first (and fsynced, so a
        clean close leaves no zero tail for the next open to find)."""
        if self._fd >= 0 and self._length > self.write_pos % self.chunk_size:
            try:
                self._set_length(self.write_pos % self.chunk_size)
                os.fsync(self._fd)
            except OSError as e:  # the next open's recovery cuts the zero tail instead
                log.warning("could not cut the commit log's zero tail at close: %s", e)
        self.release_files()

    def release_files(self) -> None:
        """Unmap and close every file as they are, the zero tail included (what a killed process
        leaves; close() cuts the tail first)."""
        with self._lock:
            fds = self._sealed + ([self._fd] if self._fd >= 0 else [])
            self._sealed, self._fd = [], -1
            for m in self._maps.values():
                m.unmap()
            self._maps.clear()
        for fd in fds:
            os.close(fd)
