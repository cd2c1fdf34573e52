"""Crash recovery: find the end of the valid log, cut off everything after it, fix the index.

The log is valid up to the first position where a record does not verify (record.verify: size,
magic, lengths, crc; and its stamped position must equal where it sits). Scanning starts at the
checkpoint (a position known durable and indexed) and follows end-of-chunk markers into the next
chunk. Everything past the first bad byte is truncated, later chunk files included, and reported:
a crash loses at most what was not yet acknowledged, never silently.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from dataclasses import dataclass, field

from equeue_core.errors import CorruptRecordError
from equeue_core.record import HEADER_SIZE, INDEX_ENTRY, OFF_POSITION, OFF_QUEUE_OFFSET, verify

from .constants import CHECKPOINT_MAGIC, CHECKPOINT_SIZE, CHECKPOINT_STRUCT, END_OF_CHUNK, END_OF_CHUNK_SIZE

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<QQI")          # position, queue offset, queue id at OFF_POSITION
_TAG_AND_TOPIC_LEN = struct.Struct("<QH")  # tag hash at 52, topic_len at 60


@dataclass(slots=True)
class ScanResult:
    end: int                      # one past the last valid record
    truncated_bytes: int = 0      # bytes cut off (torn/corrupt tail, later chunks)
    records: int = 0              # valid records scanned
    # (topic, queue id) -> [(queue offset, packed index entry)] for every scanned record
    entries: dict[tuple[str, int], list[tuple[int, bytes]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def read_checkpoint(path: str) -> int | None:
    """The log end the checkpoint vouches for, or None if missing or damaged."""
    from equeue_core.record import crc32c

    try:
        with open(path, "rb") as f:
            data = f.read(CHECKPOINT_SIZE + 1)
    except FileNotFoundError:
        return None
    if len(data) != CHECKPOINT_SIZE:
        return None
    magic, version, _flags, end, crc = CHECKPOINT_STRUCT.unpack(data)
    if magic != CHECKPOINT_MAGIC or version != 1 or crc != crc32c(data[:CHECKPOINT_SIZE - 4]):
        return None
    return end


def pack_checkpoint(end: int) -> bytes:
    from equeue_core.record import crc32c

    head = CHECKPOINT_STRUCT.pack(CHECKPOINT_MAGIC, 1, 0, end, 0)[:CHECKPOINT_SIZE - 4]
    return head + struct.pack("<I", crc32c(head))


def scan_log(log_dir: str, chunks: list[int], chunk_size: int, start: int,
             collect: bool = True) -> ScanResult:
    """Verify records from `start` on, truncating the log after the last valid one.

    `chunks` (start positions, ascending) is updated in place when chunk files are deleted.
    """
    from .constants import file_name

    pos = start
    result = ScanResult(end=start)
    entries = result.entries
    while True:
        cstart = pos - pos % chunk_size
        if cstart not in chunks:
            break
        path = os.path.join(log_dir, file_name(cstart))
        off = pos - cstart
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data: bytes | mmap.mmap = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                                       if size else b"")
        try:
            off, next_chunk = _scan_chunk(data, off, cstart, size, result, entries if collect else None)
        finally:
            if isinstance(data, mmap.mmap):
                data.close()
        if next_chunk and cstart + chunk_size in chunks:
            pos = cstart + chunk_size
            continue
        # the valid log ends here: cut this chunk's tail and drop every later chunk
        result.end = cstart + off
        if size > off:
            bad = size - off
            tail_is_marker = next_chunk and bad == END_OF_CHUNK_SIZE
            if not tail_is_marker:
                result.truncated_bytes += bad
                result.notes.append(f"chunk {file_name(cstart)}: cut {bad} bytes at offset {off}")
            os.truncate(path, off)
        for later in [c for c in chunks if c > cstart]:
            lpath = os.path.join(log_dir, file_name(later))
            lsize = os.path.getsize(lpath)
            result.truncated_bytes += lsize
            result.notes.append(f"chunk {file_name(later)}: deleted ({lsize} bytes after the valid end)")
            os.unlink(lpath)
            chunks.remove(later)
        return result
    result.end = pos
    return result


def _scan_chunk(data: bytes | mmap.mmap, off: int, cstart: int, size: int, result: ScanResult,
                entries: dict[tuple[str, int], list[tuple[int, bytes]]] | None) -> tuple[int, bool]:
    """Walk one chunk from off; returns (offset after the last valid record, saw end marker)."""
    unpack_head = _HEAD.unpack_from
    unpack_tt = _TAG_AND_TOPIC_LEN.unpack_from
    pack_entry = INDEX_ENTRY.pack
    while off < size:
        if data[off:off + END_OF_CHUNK_SIZE] == END_OF_CHUNK:
            return off, True
        try:
            rsize = verify(data, off, size)
        except CorruptRecordError as e:
            log.debug("scan stops: %s", e)
            return off, False
        position, qoff, qid = unpack_head(data, off + OFF_POSITION)
        if position != cstart + off:
            log.debug("scan stops: record at %d says position %d", cstart + off, position)
            return off, False
        if entries is not None:
            tag_hash, tlen = unpack_tt(data, off + 52)
            topic = bytes(data[off + HEADER_SIZE:off + HEADER_SIZE + tlen]).decode("utf-8", "replace")
            entries.setdefault((topic, qid), []).append((qoff, pack_entry(position, rsize, tag_hash)))
        result.records += 1
        off += rsize
    return off, False


__all__ = ["ScanResult", "read_checkpoint", "pack_checkpoint", "scan_log", "OFF_QUEUE_OFFSET"]
