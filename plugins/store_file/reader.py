"""FileStoreReader: read a live data directory from another process (Spark) without the broker.

What it trusts (docs/format.md, "What a concurrent reader may trust"): the writer appends a record
to the commit log before it appends the record's index entry, so an index entry that exists points
at bytes already written. The reader still verifies every record it serves (record.verify: size,
magic, lengths, crc, and the stamped position) and stops at the first that fails. queue_range()
trusts entries pointing below the writer's checkpoint (durable, and valid when it was written) and
verifies every later one once, stopping at the first that fails (e.g. a crashed broker that has
not recovered yet), so its end is safe. Chunks deleted
by retention while a read is under way end that read at the last record it could still get.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from equeue_core.contracts import StoreSettings
from equeue_core.errors import CorruptRecordError, OffsetOutOfRangeError
from equeue_core.export import (
    MAX_BATCH_BYTES,
    RowFilter,
    broker_address_of,
    first_damaged,
    index_entry_dtype,
    layout_to_arrow,
)
from equeue_core.record import (
    HEADER_SIZE,
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    OFF_POSITION,
    corrupt_record,
    damage,
    verify,
)

from .commit_log import list_chunks
from .constants import CHECKPOINT, COMMITLOG_DIR, DEFAULT_CHUNK_SIZE, file_name
from .offsets import load_offsets
from .queue_index import FileQueueIndex
from .recovery import read_checkpoint
from .store_info import load_store_info

_U64 = struct.Struct("<Q")
_STORE_TS = struct.Struct("<q")
_MAX_SPAN = 4 * 1024 * 1024  # one pread covers at most this many bytes of the log


class FileStoreReader:
    def __init__(self, path: str, options: dict[str, str] | None = None) -> None:
        options = dict(options or {})
        self.path = path
        info = load_store_info(path)
        self.chunk_size = int(info["chunk_size"]) if info else int(options.get("chunk_size") or DEFAULT_CHUNK_SIZE)
        self.log_dir = os.path.join(path, COMMITLOG_DIR)
        self.index = FileQueueIndex(StoreSettings(path, options=options), read_only=True)
        self._fds: dict[int, int] = {}
        self._good: dict[tuple[str, int], int] = {}   # offsets below this were verified
        self._address: tuple[str, int] | None = None

    # ------------------------------------------------------------ raw access
    def _chunk_fd(self, cstart: int) -> int | None:
        fd = self._fds.get(cstart)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.log_dir, file_name(cstart)), os.O_RDONLY)
            except FileNotFoundError:
                return None
            self._fds[cstart] = fd
        return fd

    def _pread(self, position: int, size: int) -> bytes | None:
        cstart = position - position % self.chunk_size
        fd = self._chunk_fd(cstart)
        if fd is None:
            return None
        data = os.pread(fd, size, position - cstart)
        return data if len(data) == size else None

    def _pread_into(self, position: int, out: memoryview) -> bool:
        """Fill out with the log bytes at position (within one chunk file); False if they are gone."""
        cstart = position - position % self.chunk_size
        fd = self._chunk_fd(cstart)
        return fd is not None and os.preadv(fd, [out], position - cstart) == len(out)

    def _record_ok(self, entry: bytes | memoryview) -> bool:
        pos, size, _th = INDEX_ENTRY.unpack_from(entry)
        data = self._pread(pos, size)
        if data is None:
            return False
        try:
            return verify(data) == size and _U64.unpack_from(data, OFF_POSITION)[0] == pos
        except CorruptRecordError:
            return False

    def _log_start(self) -> int:
        chunks = list_chunks(self.log_dir)
        return chunks[0] if chunks else 0

    # ------------------------------------------------------------ ranges
    def queues(self) -> dict[str, list[int]]:
        return self.index.queues()

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(first offset still stored, safe end): every offset in between is an intact record."""
        lo, hi = self.index.queue_range(topic, queue_id)
        lo = self._first_at_or_after(topic, queue_id, lo, hi, self._log_start())
        if hi <= lo:
            return (lo, max(lo, hi))
        key = (topic, queue_id)
        good = self._good.get(key, lo)
        if good < lo:
            good = lo
        if good < hi:
            # records below the writer's checkpoint are durable and were valid when it was written;
            # everything after it is verified here, once, and remembered
            checkpoint = read_checkpoint(os.path.join(self.path, CHECKPOINT)) or 0
            good = max(good, self._first_at_or_after(topic, queue_id, good, hi, checkpoint))
            good = self._verify_forward(topic, queue_id, good, hi)
        self._good[key] = good
        return (lo, good)

    def _verify_forward(self, topic: str, queue_id: int, offset: int, hi: int) -> int:
        while offset < hi:
            entries = self.index.read(topic, queue_id, offset, min(4096, hi - offset))
            if not entries:
                return offset
            for i in range(0, len(entries), INDEX_ENTRY_SIZE):
                if not self._record_ok(entries[i:i + INDEX_ENTRY_SIZE]):
                    return offset
                offset += 1
        return offset

    def _first_at_or_after(self, topic: str, queue_id: int, lo: int, hi: int, position: int) -> int:
        if position == 0:
            return lo
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.index.read(topic, queue_id, mid, 1)
            if len(e) == INDEX_ENTRY_SIZE and _U64.unpack_from(e)[0] < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        lo, hi = self.queue_range(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.index.read(topic, queue_id, mid, 1)
            head = self._pread(_U64.unpack_from(e)[0], HEADER_SIZE) if len(e) == INDEX_ENTRY_SIZE else None
            if head is None or _STORE_TS.unpack_from(head, 44)[0] < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------ export
    def export(self, topic: str, queue_id: int, start: int, end: int,
               batch_rows: int = 65536, columns: Sequence[str] | None = None,
               row_filter: RowFilter | None = None) -> Iterator[Any]:
        """Arrow RecordBatches for offsets [start, end) cut to the safe range; stops early at a
        record that does not verify or a chunk deleted meanwhile. Only `columns` are built, and
        rows `row_filter` rejects are left out (equeue_core.export.layout_to_arrow)."""
        lo, hi = self.queue_range(topic, queue_id)
        if start < lo:
            raise OffsetOutOfRangeError(f"offset {start} of {topic}/{queue_id} is below {lo}",
                                        min_offset=lo, max_offset=hi)
        end = min(end, hi)
        if self._address is None:
            self._address = broker_address_of(self.path)
        offset = start
        batch_rows = max(1, int(batch_rows))
        while offset < end:
            entries = self.index.read(topic, queue_id, offset, min(batch_rows, end - offset))
            if not entries:
                return
            data, starts, complete = self._records(entries, topic, queue_id, offset)
            if len(starts):
                yield layout_to_arrow(data, starts, self._address, columns, row_filter)
            if not complete:
                return
            offset += len(starts)

    def _records(self, entries: memoryview, topic: str, queue_id: int,
                 offset: int) -> tuple[bytes | bytearray, Any, bool]:
        """(buffer, record starts in it) for the entries' records (queue offsets from `offset`),
        read into one buffer in spans of at most _MAX_SPAN bytes (at most MAX_BATCH_BYTES in all:
        fewer records then) and verified all at once (vectorised, one batched crc call); the bool
        is False if a chunk was deleted meanwhile (the starts stop before it). A record that
        does not verify raises CorruptRecordError: below the safe end every record was intact
        once, so this one was damaged since."""
        import numpy as np

        e = np.frombuffer(entries, dtype=index_entry_dtype())
        pos = e["position"].astype(np.int64)
        size = e["size"].astype(np.int64)
        ends = pos + size
        chunk = pos // self.chunk_size
        n = len(pos)
        monotone = n < 2 or bool((pos[1:] >= ends[:-1]).all())
        spans: list[tuple[int, int, int, int]] = []  # (first record, end record, log position, bytes)
        total = 0
        i = 0
        while i < n:
            first = int(pos[i])
            if monotone:  # the usual case: a queue's records sit in log order
                j = min(int(np.searchsorted(ends, first + _MAX_SPAN, side="right")),
                        int(np.searchsorted(chunk, chunk[i], side="right")))
            else:
                j = i + 1
                while (j < n and pos[j] >= first and ends[j] - first <= _MAX_SPAN
                       and chunk[j] == chunk[i]):
                    j += 1
            j = max(j, i + 1)
            length = int(ends[i:j].max()) - first
            spans.append((i, j, first, length))
            total += length
            i = j
            if total >= MAX_BATCH_BYTES - _MAX_SPAN:
                break  # a batch's bytes stay addressable by Arrow; the caller asks for the rest
        # one buffer read into span by span (no joining copy), verified in one call
        data: bytes | bytearray = bytearray(total) if len(spans) > 1 else b""
        view = memoryview(data)
        starts: list = []
        complete = True
        base = 0
        for i, j, first, length in spans:
            if len(spans) == 1:
                got = self._pread(first, length)
                if got is not None:
                    data = got
            elif self._pread_into(first, view[base:base + length]):
                got = b""
            else:
                got = None
            if got is None:
                complete = False
                break
            starts.append(pos[i:j] - first + base)
            base += length
        view.release()
        if not starts:
            return b"", np.zeros(0, dtype=np.int64), complete
        at = np.concatenate(starts)
        m = len(at)
        bad = first_damaged(data, at, size[:m], pos[:m])
        if bad is not None:
            why = damage(data, int(at[bad]), int(size[bad]), int(pos[bad])) or "record failed verification"
            raise corrupt_record(topic, queue_id, offset + bad, int(pos[bad]), why)
        return data, at, complete

    def group_offsets(self) -> dict[tuple[str, str, int], int]:
        return load_offsets(self.path).offsets

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.index.close()
