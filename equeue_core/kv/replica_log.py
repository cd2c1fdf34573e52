"""contracts.ReplicaLog for key-value stores (LMDB, RocksDB), over a few engine primitives.

The KV log is a virtual byte log: chunk values keyed by the position of their first record,
back to back with no padding (chunks.py). A replica keeps the master's positions and queue
offsets exactly; its own chunking may differ (chunks never span two queues' runs, so retention
still drops a log chunk together with its index chunk).

An engine supplies `KVOps` over one write (an LMDB write transaction, a RocksDB WriteBatch plus
its reads), and the store applies what `stage_append` / `stage_truncate` put into it in one
commit: a crash leaves the replica's log either before or after a copy or a cut, never between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from equeue_core.errors import StoreError
from equeue_core.kv import chunks, keys
from equeue_core.kv.queries import bisect_first
from equeue_core.log_copy import CopiedLog, parse_copied, whole_records
from equeue_core.record import INDEX_ENTRY, INDEX_ENTRY_SIZE, OFF_POSITION

LOG, INDEX, QUEUES, STATE = "log", "index", "queues", "state"


class KVOps(Protocol):
    """Reads and writes of one engine write (reads see the state before it)."""

    def floor(self, space: str, key: bytes) -> tuple[bytes, Any] | None:
        """The greatest (key, value) with key <= `key`, or None."""
        ...

    def scan_from(self, space: str, key: bytes) -> Iterator[tuple[bytes, Any]]:
        """(key, value) pairs with key >= `key`, ascending."""
        ...

    def put(self, space: str, key: bytes, value: bytes | memoryview) -> None: ...
    def delete(self, space: str, key: bytes) -> None: ...


def read_log(ops: KVOps, position: int, max_bytes: int, end: int) -> bytes:
    """contracts.ReplicaLog.read_log over a read snapshot: whole chunks' records from position."""
    if position >= end:
        if position > end:
            raise StoreError(f"position {position} is past the log end {end}")
        return b""
    found = ops.floor(LOG, keys.log_key(position))
    if found is None or keys.position_of(found[0]) + len(found[1]) <= position:
        raise StoreError(f"position {position} is not stored (deleted by retention?)")
    start = keys.position_of(found[0])
    first = memoryview(found[1])[position - start:]
    if int.from_bytes(first[OFF_POSITION:OFF_POSITION + 8], "little") != position:
        raise StoreError(f"position {position} is not the start of a record in this log")
    want = max(max_bytes, int.from_bytes(first[:4], "little"))
    out = [bytes(first[:whole_records(first, want)])]
    total = len(out[0])
    at = position + total
    if total == len(first):  # the whole chunk fitted: go on with the chunks after it
        for k, v in ops.scan_from(LOG, keys.log_key(at)):
            if keys.position_of(k) != at or total + len(v) > max_bytes:
                break
            out.append(bytes(v))
            total += len(v)
            at += len(v)
    return b"".join(out)


def stage_append(ops: KVOps, position: int, end: int, data: bytes | bytearray | memoryview,
                 ranges: dict[tuple[str, int], tuple[int, int]], chunk_bytes: int
                 ) -> tuple[CopiedLog, dict[tuple[str, int], tuple[int, int]]]:
    """Put copied records (checked by parse_copied) into ops: log chunks, index chunks, queue
    ranges, next position. Returns the parsed copy and the new ranges to publish after commit."""
    if position != end:
        raise StoreError(f"copy at position {position} does not continue this log (its end is {end})")
    copied = parse_copied(data, lambda t, q: ranges.get((t, q), (0, 0))[1])
    if copied.start != end:
        raise StoreError(f"copied records start at position {copied.start}, this log ends at {end} "
                         "(a gap or an overlap)")
    mv = memoryview(data)
    new_ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for run in copied.runs:
        key = (run.topic, run.queue_id)
        prefix = keys.queue_key(*key)
        n = len(run.starts)
        for i, count in chunks.split(run.starts, run.end, chunk_bytes):
            j = i + count
            ops.put(LOG, keys.log_key(run.positions[i]), mv[run.starts[i]:run.starts[j] if j < n else run.end])
            ops.put(INDEX, keys.index_key(prefix, run.first_offset + i),
                    bytes(run.entries[i * INDEX_ENTRY_SIZE:j * INDEX_ENTRY_SIZE]))
        lo, _hi = new_ranges.get(key) or ranges.get(key) or (run.first_offset, run.first_offset)
        new_ranges[key] = (min(lo, run.first_offset), run.first_offset + n)
        ops.put(QUEUES, prefix, keys.QUEUE_RANGE.pack(*new_ranges[key]))
    ops.put(STATE, keys.NEXT_POSITION, keys.U64_VALUE.pack(copied.end))
    return copied, new_ranges


def stage_truncate(ops: KVOps, position: int, end: int, start: int,
                   ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """Put the cut at position into ops: log chunks at and past it deleted (the one holding it
    shortened), every queue's index cut at its first entry at or past it, ranges and next
    position moved back. Returns the new ranges to publish after commit."""
    if position > end:
        raise StoreError(f"cannot truncate at {position}: the log ends at {end}")
    if position < start:
        raise StoreError(f"cannot truncate at {position}: below the log start {start}")
    found = ops.floor(LOG, keys.log_key(position))
    if found is not None:
        cstart = keys.position_of(found[0])
        value = memoryview(found[1])
        if cstart < position < cstart + len(value):
            at = position - cstart
            if int.from_bytes(value[at + OFF_POSITION:at + OFF_POSITION + 8], "little") != position:
                raise StoreError(f"cannot truncate at {position}: not the start of a record")
            ops.put(LOG, found[0], bytes(value[:at]))
    for k in [bytes(k) for k, _v in ops.scan_from(LOG, keys.log_key(position))]:
        ops.delete(LOG, k)
    new_ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for (topic, qid), (lo, hi) in ranges.items():
        prefix = keys.queue_key(topic, qid)
        entry = _entry_reader(ops, prefix)
        cut = bisect_first(lo, hi, lambda o, entry=entry: entry(o) >= position)
        if cut == hi:
            continue
        found = ops.floor(INDEX, keys.index_key(prefix, cut))
        if found is not None and bytes(found[0]).startswith(prefix):
            first = keys.QUEUE_OFFSET.unpack_from(bytes(found[0]), len(prefix))[0]
            if first < cut:
                ops.put(INDEX, bytes(found[0]), bytes(memoryview(found[1])[:(cut - first) * INDEX_ENTRY_SIZE]))
        doomed = []
        for k, _v in ops.scan_from(INDEX, keys.index_key(prefix, cut)):
            if not bytes(k).startswith(prefix):
                break
            doomed.append(bytes(k))
        for k in doomed:
            ops.delete(INDEX, k)
        new_ranges[(topic, qid)] = (min(lo, cut), cut)
        ops.put(QUEUES, prefix, keys.QUEUE_RANGE.pack(*new_ranges[(topic, qid)]))
    ops.put(STATE, keys.NEXT_POSITION, keys.U64_VALUE.pack(position))
    return new_ranges


def _entry_reader(ops: KVOps, prefix: bytes) -> Callable[[int], int]:
    """queue offset -> the position its index entry names (one floor seek)."""
    def position_of(offset: int) -> int:
        found = ops.floor(INDEX, keys.index_key(prefix, offset))
        if found is None or not bytes(found[0]).startswith(prefix):
            raise StoreError(f"no index entry for offset {offset}")
        first = keys.QUEUE_OFFSET.unpack_from(bytes(found[0]), len(prefix))[0]
        return INDEX_ENTRY.unpack_from(found[1], (offset - first) * INDEX_ENTRY_SIZE)[0]
    return position_of

