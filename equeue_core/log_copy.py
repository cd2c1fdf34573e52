"""Checking a run of replicated records before a replica stores them (contracts.ReplicaLog).

A replica stores what its master's read_log returned byte for byte, so the bytes must be whole,
intact records that continue the replica's log: every record verifies (size, magic, lengths,
crc), positions follow each other without a gap, and each queue's offsets continue from where the
replica's queue ends. `parse_copied` checks all of that before anything is written, so a refused
copy leaves the store as it was. Store plugins (file, LMDB, RocksDB) share it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from equeue_core.errors import CorruptRecordError, StoreError
from equeue_core.record import HEADER_SIZE, INDEX_ENTRY, OFF_POSITION, OFF_STORE_TS, verify

_HEAD = struct.Struct("<QQI")           # position, queue offset, queue id at OFF_POSITION
_TAG_AND_TOPIC_LEN = struct.Struct("<QH")  # tag hash at 52, topic_len at 60
_TS = struct.Struct("<q")


@dataclass(slots=True)
class CopiedRun:
    """Consecutive records of one queue inside a copied run of records."""

    topic: str
    queue_id: int
    first_offset: int
    starts: list[int] = field(default_factory=list)      # offsets of its records in the data
    positions: list[int] = field(default_factory=list)   # their stamped positions
    entries: bytearray = field(default_factory=bytearray)  # packed record.INDEX_ENTRY, one per record
    end: int = 0                                          # offset in the data one past its last record


@dataclass(slots=True)
class CopiedLog:
    start: int            # stamped position of the first record
    end: int              # one past the last record (stamped position + size)
    runs: list[CopiedRun]
    last_store_ts: int
    records: int


def parse_copied(data: bytes | bytearray | memoryview, queue_end: Callable[[str, int], int]) -> CopiedLog:
    """Check `data` (whole records as a master stored them) and cut it into per-queue runs.

    `queue_end(topic, queue_id)` is the replica's next offset of that queue (0 for a new queue,
    when the first copied offset may be anything: the master's queue may start above 0 after
    retention). Raises StoreError naming the first problem; nothing is stored by this function."""
    size = len(data)
    if size == 0:
        raise StoreError("nothing to append")
    runs: list[CopiedRun] = []
    nxt: dict[tuple[str, int], int] = {}
    at = 0
    start = expect = -1
    last_ts = 0
    count = 0
    run: CopiedRun | None = None
    while at < size:
        try:
            rsize = verify(data, at, size)
        except CorruptRecordError as e:
            raise StoreError(f"copied records: bad record at byte {at} of {size}: {e}") from None
        position, qoff, qid = _HEAD.unpack_from(data, at + OFF_POSITION)
        if start < 0:
            start = expect = position
        elif position != expect:
            raise StoreError(f"copied records: record at byte {at} says position {position}, "
                             f"expected {expect} (a gap or an overlap)")
        tag_hash, tlen = _TAG_AND_TOPIC_LEN.unpack_from(data, at + 52)
        topic = bytes(data[at + HEADER_SIZE:at + HEADER_SIZE + tlen]).decode("utf-8", "replace")
        key = (topic, qid)
        want = nxt.get(key)
        if want is None:
            want = queue_end(topic, qid)
            if want == 0 and qoff > 0 and key not in nxt:
                want = qoff  # a queue new to the replica may start where the master's starts
        if qoff != want:
            raise StoreError(f"copied records: {topic}/{qid} offset {qoff} at position {position} "
                             f"does not continue the queue (next offset here is {want})")
        nxt[key] = qoff + 1
        if run is None or (run.topic, run.queue_id) != key:
            run = CopiedRun(topic, qid, qoff)
            runs.append(run)
        run.starts.append(at)
        run.positions.append(position)
        run.entries += INDEX_ENTRY.pack(position, rsize, tag_hash)
        last_ts = max(last_ts, _TS.unpack_from(data, at + OFF_STORE_TS)[0])
        at += rsize
        run.end = at
        expect = position + rsize
        count += 1
    return CopiedLog(start, expect, runs, last_ts, count)


def whole_records(data: bytes | bytearray | memoryview, max_bytes: int) -> int:
    """How many leading bytes of data are whole records, at most max_bytes (but at least the
    first record if it is whole): the cut a read_log answer makes. Stops at anything that is not
    a record header (a zero size: the file store's end-of-chunk marker)."""
    at = 0
    size = len(data)
    while at + HEADER_SIZE <= size:
        rsize = int.from_bytes(data[at:at + 4], "little")
        if rsize < HEADER_SIZE or at + rsize > size or (at and at + rsize > max_bytes):
            break
        at += rsize
        if at >= max_bytes:
            break
    return at


__all__ = ["CopiedLog", "CopiedRun", "parse_copied", "whole_records", "OFF_POSITION"]
