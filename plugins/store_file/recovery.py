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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from equeue_core.errors import CorruptRecordError
from equeue_core.record import HEADER_SIZE, INDEX_ENTRY, OFF_POSITION, OFF_QUEUE_OFFSET, verify

from .constants import CHECKPOINT_MAGIC, CHECKPOINT_SIZE, CHECKPOINT_STRUCT, END_OF_CHUNK, END_OF_CHUNK_SIZE

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<QQI")          # position, queue offset, queue id at OFF_POSITION
_TAG_AND_TOPIC_LEN = struct.Struct("<QH")  # tag hash at 52, topic_len at 60
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_QUEUE_TAIL = struct.Struct("<IQ")  # queue id, index end: after a queue's topic in the checkpoint


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
    found = read_checkpoint_queues(path)
    return None if found is None else found[0]


def read_checkpoint_queues(path: str) -> tuple[int, dict[tuple[str, int], int] | None] | None:
    """(log end, each queue's index end when it was written) from the checkpoint; the queue
    table is None for a version 1 checkpoint (which has none). None if missing or damaged."""
    from equeue_core.record import crc32c

    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < CHECKPOINT_SIZE:
        return None
    magic, version, _flags, end, _crc = CHECKPOINT_STRUCT.unpack_from(data)
    if magic != CHECKPOINT_MAGIC:
        return None
    if version == 1:
        if len(data) != CHECKPOINT_SIZE or _crc != crc32c(data[:CHECKPOINT_SIZE - 4]):
            return None
        return end, None
    if version != 2 or struct.unpack_from("<I", data, len(data) - 4)[0] != crc32c(data[:-4]):
        return None
    (count,) = _U32.unpack_from(data, 16)
    queues: dict[tuple[str, int], int] = {}
    at = 20
    try:
        for _ in range(count):
            (tlen,) = _U16.unpack_from(data, at)
            topic = data[at + 2:at + 2 + tlen].decode()
            qid, qend = _QUEUE_TAIL.unpack_from(data, at + 2 + tlen)
            queues[(topic, qid)] = qend
            at += 2 + tlen + _QUEUE_TAIL.size
    except (struct.error, UnicodeDecodeError):
        return None
    return end, queues


def pack_checkpoint(end: int, queues: dict[tuple[str, int], int] | None = None) -> bytes:
    """A version 2 checkpoint: the log end and every queue's index end (docs/format.md §5)."""
    from equeue_core.record import crc32c

    parts = [struct.pack("<IHHQI", CHECKPOINT_MAGIC, 2, 0, end, len(queues or {}))]
    for (topic, qid), qend in sorted((queues or {}).items()):
        t = topic.encode()
        parts.append(_U16.pack(len(t)) + t + _QUEUE_TAIL.pack(qid, qend))
    body = b"".join(parts)
    return body + struct.pack("<I", crc32c(body))


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
        with _mapped(path) as (data, size):
            off, next_chunk = _scan_chunk(data, pos - cstart, cstart, size, result,
                                          entries if collect else None)
            sealed = next_chunk and cstart + chunk_size in chunks
            # where the records end, marker included if sealed; past it, the last non-zero byte
            records_end = off + END_OF_CHUNK_SIZE if sealed else off
            written_end = _nonzero_end(data, records_end, size)
        if sealed:
            if size > records_end:  # the roll's cut of this chunk never reached the disk
                bad = written_end - records_end
                if bad:
                    result.truncated_bytes += bad
                    result.notes.append(f"chunk {file_name(cstart)}: cut {bad} bytes after its end marker")
                os.truncate(path, records_end)
            pos = cstart + chunk_size
            continue
        # the valid log ends here: cut this chunk's tail and drop every later chunk
        result.end = cstart + off
        if size > off:
            # zero bytes at the end are the length the writer set ahead of its records
            # (commit_log.py), where nothing was written: cut, but not counted as torn data
            bad = written_end - off
            tail_is_marker = next_chunk and bad == END_OF_CHUNK_SIZE
            if bad and not tail_is_marker:
                result.truncated_bytes += bad
                result.notes.append(f"chunk {file_name(cstart)}: cut {bad} bytes at offset {off}")
            os.truncate(path, off)
        for later in [c for c in chunks if c > cstart]:
            lpath = os.path.join(log_dir, file_name(later))
            with _mapped(lpath) as (ldata, lfile_size):
                lsize = _nonzero_end(ldata, 0, lfile_size)
            result.truncated_bytes += lsize
            result.notes.append(f"chunk {file_name(later)}: deleted ({lsize} bytes after the valid end)")
            os.unlink(lpath)
            chunks.remove(later)
        return result
    result.end = pos
    return result


def _nonzero_end(data: bytes | mmap.mmap, start: int, end: int, step: int = 1 << 20) -> int:
    """The end of the last non-zero byte of `data` in [start, end); start if all are zero.
    Looks backwards a step at a time (a zero tail is up to LENGTH_AHEAD long)."""
    while end > start:
        lo = max(start, end - step)
        part = data[lo:end].rstrip(b"\0")
        if part:
            return lo + len(part)
        end = lo
    return start


@contextmanager
def _mapped(path: str) -> Iterator[tuple[bytes | mmap.mmap, int]]:
    """A chunk file mapped for reading (b"" when empty) and its size; unmapped on exit."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data: bytes | mmap.mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    try:
        yield data, size
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def collect_queue_records(log_dir: str, chunks: list[int], chunk_size: int, end: int,
                          wanted: set[tuple[str, int]]) -> tuple[dict[tuple[str, int], list[tuple[int, bytes]]],
                                                                 list[str]]:
    """Index entries (queue offset, packed entry) of every record of the `wanted` queues in the
    log below `end`, for rebuilding their index. Unlike scan_log it never truncates: a record that
    does not verify ends the walk of its chunk only (noted), and the next chunk is walked, so a
    damaged stretch of old data costs the records in it, never the rest of the log."""
    entries: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    notes: list[str] = []
    from .constants import file_name

    for cstart in list(chunks):
        if cstart >= end:
            break
        path = os.path.join(log_dir, file_name(cstart))
        with _mapped(path) as (data, file_size):
            size = min(file_size, end - cstart)
            off, marker = _scan_chunk(data, 0, cstart, size, ScanResult(end=cstart), entries, wanted)
        if off < size and not marker:
            notes.append(f"chunk {file_name(cstart)}: unreadable from offset {off}; "
                         f"its records after that are not indexed")
    return entries, notes


def _scan_chunk(data: bytes | mmap.mmap, off: int, cstart: int, size: int, result: ScanResult,
                entries: dict[tuple[str, int], list[tuple[int, bytes]]] | None,
                wanted: set[tuple[str, int]] | None = None) -> tuple[int, bool]:
    """Walk one chunk from off; returns (offset after the last valid record, saw end marker).
    With `wanted`, only those queues' records are collected into entries."""
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
            if wanted is None or (topic, qid) in wanted:
                entries.setdefault((topic, qid), []).append((qoff, pack_entry(position, rsize, tag_hash)))
        result.records += 1
        off += rsize
    return off, False


__all__ = ["ScanResult", "read_checkpoint", "read_checkpoint_queues", "pack_checkpoint", "scan_log",
           "collect_queue_records", "OFF_QUEUE_OFFSET"]
