"""How an append becomes key-value pairs: the batch is cut into chunks of whole records.

Each chunk is one value in `log` (key: the position of its first record; value: its records, as
stamped, back to back) and one value in `index` (key: queue + first queue offset; value: the
chunk's INDEX_ENTRY entries). One put per chunk instead of two per record is what makes an append
cost about what stamping it costs; a chunk is capped at `chunk_bytes` so a random read copies at
most that much. A chunk never spans two appends, so its log and index values are created and
deleted together (retention drops whole chunks).

Positions are byte offsets in this virtual log (like the file store's), so the position of every
record of a batch is arithmetic, and a record is found from its position by one floor seek.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from equeue_core.errors import MessageNotFoundError
from equeue_core.kv import keys
from equeue_core.record import HEADER_SIZE, INDEX_ENTRY_SIZE, OFF_POSITION, index_entries, stamp_batch, verify

DEFAULT_CHUNK_BYTES = 64 * 1024

_U32 = struct.Struct("<I")


def batch_end(batch: bytes | bytearray, starts: Sequence[int]) -> int:
    """One past the last byte of the last record (records are back to back, as record.scan found them)."""
    last = starts[-1]
    return last + _U32.unpack_from(batch, last)[0]


def positions_for(starts: Sequence[int], base: int) -> list[int]:
    first = starts[0]
    return [base + s - first for s in starts]


def split(starts: Sequence[int], end: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(first record index, record count) of each chunk: whole records, at most chunk_bytes unless
    a single record is larger."""
    out = []
    first = 0
    n = len(starts)
    for i in range(1, n):
        record_end = starts[i + 1] if i + 1 < n else end
        if record_end - starts[first] > chunk_bytes:
            out.append((first, i - first))
            first = i
    out.append((first, n - first))
    return out


@dataclass(slots=True)
class StampedBatch:
    """A batch stamped for a key-value store, cut into the values one write will put."""

    positions: list[int]  # the store position of each record
    log_chunks: list[tuple[bytes, memoryview]]  # (log key, the chunk's stamped records)
    index_chunks: list[tuple[int, memoryview]]  # (first queue offset, the chunk's INDEX_ENTRY entries)
    end: int  # the store's next position once the batch is written


def stamp_chunks(batch: bytearray, starts: Sequence[int], base: int, first_offset: int, queue_id: int,
                 store_ts: int, chunk_bytes: int) -> StampedBatch:
    """Stamp a scanned batch (positions from `base`, queue offsets from `first_offset`) and cut
    it into chunks: what LMDB's transaction and RocksDB's WriteBatch both put. The views share
    `batch`'s memory (no copy); the caller writes them before `batch` changes."""
    positions = positions_for(starts, base)
    stamp_batch(batch, starts, positions, first_offset, queue_id, store_ts)
    entries = memoryview(index_entries(batch, starts, positions))
    stop = batch_end(batch, starts)
    mv = memoryview(batch)
    n = len(starts)
    log_chunks = []
    index_chunks = []
    for i, count in split(starts, stop, chunk_bytes):
        j = i + count
        log_chunks.append((keys.log_key(positions[i]), mv[starts[i]:starts[j] if j < n else stop]))
        index_chunks.append((first_offset + i, entries[i * INDEX_ENTRY_SIZE:j * INDEX_ENTRY_SIZE]))
    return StampedBatch(positions, log_chunks, index_chunks, base + stop - starts[0])


_U64 = struct.Struct("<Q")
FloorChunk = Callable[[int], "tuple[int, Any] | None"]


def slice_records(positions: Sequence[int], floor_chunk: FloorChunk) -> list[Any]:
    """The record starting at each (ascending) position, sliced from its chunk; None where no
    chunk holds that position. `floor_chunk(p)` is the engine's one seek: (first position, value)
    of the greatest chunk key at or below p, or None; it runs once per chunk touched."""
    out: list[Any] = []
    start = end = -1
    value: Any = b""
    for p in positions:
        if not start <= p < end:
            found = floor_chunk(p)
            if found is None:
                out.append(None)
                continue
            start, value = found
            end = start + len(value)
            if p >= end:
                out.append(None)
                continue
        i = p - start
        if end - p < HEADER_SIZE:
            out.append(None)
            continue
        out.append(value[i:i + _U32.unpack_from(value, i)[0]])
    return out


def checked_record(rec: Any, position: int) -> bytes:
    """The record a position lookup found, verified (crc) and copied; MessageNotFoundError if
    no record starts exactly there."""
    if rec is None or len(rec) < HEADER_SIZE or _U64.unpack_from(rec, OFF_POSITION)[0] != position:
        raise MessageNotFoundError(f"no record at position {position}")
    verify(rec)
    return bytes(rec)
