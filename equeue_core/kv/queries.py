"""Engine-independent read logic over (index entries, records): pulls with tag filters, binary
searches by time and by position, Arrow export. The engine supplies two lookups that run in one
snapshot (an LMDB read txn, a RocksDB view), so a pull never mixes two states of the store.

Guarantees: every record returned has been checked (record.damage: size, magic, lengths, crc,
and the position and size its index entry names), so a damaged record is never served: a pull
serves the intact records before it and stops there, and a pull that starts at it raises
CorruptRecordError naming topic, queue, queue offset and position (record.corrupt_record); entries
or records that vanished under the reader (retention racing a pull) raise OffsetOutOfRangeError
carrying the new bounds.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from equeue_core.contracts import PullResult
from equeue_core.errors import CorruptRecordError, OffsetOutOfRangeError
from equeue_core.kv.chunks import FloorChunk
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE, OFF_STORE_TS, corrupt_record, damage

_TS = struct.Struct("<q")

# A filtered pull scans at most this many index entries before it answers with its progress, so
# a selective subscription on a long queue cannot pin the reader; the caller resumes at next_offset.
MAX_SCAN = 4096
SCAN_WINDOW = 256

EntriesFn = Callable[[int, int], bytes]
"""(first queue offset, count) -> packed INDEX_ENTRY bytes for the offsets that exist."""
RecordsFn = Callable[[Sequence[int]], Sequence[bytes | memoryview | None]]
"""ascending positions -> record bytes (None where no record is stored)."""


def out_of_range(offset: int, lo: int, hi: int) -> OffsetOutOfRangeError:
    return OffsetOutOfRangeError(f"queue offset {offset} is outside [{lo}, {hi}]", min_offset=lo, max_offset=hi)


def check_record(rec: bytes | memoryview | None, offset: int, size: int, position: int, lo: int,
                 hi: int, *, topic: str, queue_id: int) -> bytes | memoryview:
    """The record if intact and the one the index entry names; a missing one means retention won
    the race (OffsetOutOfRangeError), a bad one is corrupt (CorruptRecordError with its place)."""
    if rec is None:
        raise out_of_range(offset, lo, hi)
    why = damage(rec, 0, size, position) if len(rec) == size else f"{len(rec)} bytes, its index entry says {size}"
    if why is not None:
        raise corrupt_record(topic, queue_id, offset, position, why)
    return rec


def pull(entries: EntriesFn, records: RecordsFn, offset: int, lo: int, hi: int, max_count: int,
         max_bytes: int, tag_hashes: frozenset[int] | None, *, topic: str, queue_id: int) -> PullResult:
    """MessageStore.read_queue over one snapshot whose queue range is [lo, hi).

    next_offset is past every entry scanned; when max_count or max_bytes stops the pull it is the
    first record not served. The first matching record is always served, even if larger than
    max_bytes, so an oversized record never stalls a consumer. A damaged record ends the pull
    before it (next_offset is its offset); if it is the first to serve, CorruptRecordError.
    """
    if offset < lo or offset > hi:
        raise out_of_range(offset, lo, hi)
    out: list[bytes | memoryview] = []
    total = 0
    nxt = offset
    scanned = 0
    unpack = INDEX_ENTRY.unpack_from
    while nxt < hi and len(out) < max_count and scanned < MAX_SCAN:
        want = min(hi - nxt, max_count - len(out) if tag_hashes is None else SCAN_WINDOW)
        raw = entries(nxt, want)
        n = len(raw) // INDEX_ENTRY_SIZE
        if n < want:
            raise out_of_range(nxt + n, lo, hi)
        picked: list[tuple[int, int, int]] = []
        for i in range(n):
            pos, size, th = unpack(raw, i * INDEX_ENTRY_SIZE)
            if tag_hashes is None or th in tag_hashes:
                picked.append((nxt + i, pos, size))
                if len(picked) + len(out) >= max_count:
                    break
        recs = records([p for _, p, _ in picked]) if picked else ()
        for (off, pos, size), rec in zip(picked, recs, strict=True):
            if out and total + size > max_bytes:
                return PullResult(b"".join(out), len(out), off, lo, hi)
            try:
                out.append(check_record(rec, off, size, pos, lo, hi, topic=topic, queue_id=queue_id))
            except CorruptRecordError:
                if out:  # serve what verified; the next pull starts at the damaged one and raises
                    return PullResult(b"".join(out), len(out), off, lo, hi)
                raise
            total += size
            if len(out) >= max_count:
                return PullResult(b"".join(out), len(out), off + 1, lo, hi)
        nxt += n
        scanned += n
    return PullResult(b"".join(out), len(out), nxt, lo, hi)


def bisect_first(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """The first offset in [lo, hi) for which the monotone pred holds, else hi."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def store_ts(rec: bytes | memoryview) -> int:
    return _TS.unpack_from(rec, OFF_STORE_TS)[0]


def read_layout(entries: bytes, floor_chunk: FloorChunk, offset: int, lo: int,
                hi: int, max_bytes: int, *, topic: str, queue_id: int) -> tuple[bytes, Any]:
    """(buffer, record starts in it) for the records the packed index `entries` name (queue
    offsets from `offset`): each log chunk touched is found with one `floor_chunk` seek and the
    span of it the records occupy is copied once, then every record is verified at once
    (export.first_damaged: size, magic, version, the position its entry names, crc), not one
    Python call per record. At most max_bytes of spans are copied (at least one record): fewer
    records then. As check_record: a record no chunk holds (retention won the race) raises
    OffsetOutOfRangeError, a damaged one CorruptRecordError naming its place."""
    import numpy as np

    from equeue_core.export import first_damaged, index_entry_dtype

    e = np.frombuffer(entries, dtype=index_entry_dtype())
    pos = e["position"].astype(np.int64)
    size = e["size"].astype(np.int64)
    n = len(pos)
    ascending = n < 2 or bool((pos[1:] > pos[:-1]).all())
    pos_list = pos.tolist()
    parts: list = []
    spans: list[tuple[int, int, int, int]] = []  # (first record, chunk start, chunk end, shift into the buffer)
    base = 0
    i = 0
    while i < n:
        p = pos_list[i]
        found = floor_chunk(p)
        first, value = found if found is not None else (0, b"")
        stop = first + len(value)
        if not first <= p < stop:
            raise out_of_range(offset + i, lo, hi)
        if ascending:  # the usual case: a queue's records sit in log order
            j = int(pos.searchsorted(stop))
            cut = p - first  # copy from the first record to the end of the chunk
        else:
            inside = (pos[i:] >= first) & (pos[i:] < stop)
            j = i + (int(np.argmin(inside)) if not inside.all() else n - i)
            cut = 0
        if parts and base + len(value) - cut > max_bytes:
            break
        parts.append(memoryview(value)[cut:])
        spans.append((i, first, stop, base - first - cut))
        base += len(value) - cut
        i = j
    if len(spans) < 2:
        data = bytes(parts[0]) if parts else b""
    else:
        data = b"".join(parts)
    firsts = np.array([sp[0] for sp in spans], dtype=np.int64)
    counts = np.diff(np.append(firsts, i))
    m = int(counts.sum())
    pos, size = pos[:m], size[:m]
    chunk_end = np.repeat(np.array([sp[2] for sp in spans], dtype=np.int64), counts)
    spill = np.flatnonzero(pos + size > chunk_end)
    if spill.size:
        k = int(spill[0])
        raise corrupt_record(topic, queue_id, offset + k, int(pos[k]),
                             f"its index entry says {int(size[k])} bytes, its log chunk ends before")
    at = pos + np.repeat(np.array([sp[3] for sp in spans], dtype=np.int64), counts)
    bad = first_damaged(data, at, size, pos)
    if bad is not None:
        why = damage(data, int(at[bad]), int(size[bad]), int(pos[bad])) or "record failed verification"
        raise corrupt_record(topic, queue_id, offset + bad, int(pos[bad]), why)
    return data, at


def export_batches(read_layout: Callable[[int, int, int], tuple[bytes, Any]], start: int, end: int,
                   batch_rows: int, address: tuple[str, int], columns: Sequence[str] | None = None,
                   row_filter: Any = None) -> Iterator[Any]:
    """RecordBatches for [start, end), at most batch_rows at a time; read_layout(offset, n,
    max_bytes) returns (buffer, starts) of 1..n verified records from offset on, each call from
    one snapshot (see read_layout). Only `columns` are built and rows `row_filter` rejects are
    left out (equeue_core.export.layout_to_arrow)."""
    from equeue_core.export import MAX_BATCH_BYTES, layout_to_arrow

    batch_rows = max(1, batch_rows)
    off = start
    while off < end:
        data, starts = read_layout(off, min(batch_rows, end - off), MAX_BATCH_BYTES)
        yield layout_to_arrow(data, starts, address, columns, row_filter)
        off += len(starts)
