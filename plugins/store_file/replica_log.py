"""FileReplicaLog: the file store's contracts.ReplicaLog, over its commit log and queue index.

A replica's commit log is byte-identical to its master's: records land at the positions the
master stamped, and where the master sealed a chunk (its end-of-chunk marker, then the next
chunk's start) the replica seals its own at the same byte. read_log answers from one chunk at a
time and skips the marker: a copy whose first record sits at the next chunk's start is that roll.

truncate_log makes the cut durable in an order a crash cannot undo badly: first a checkpoint
that vouches only for the kept log and the kept index ends, then the chunk files (cut and
unlinked, fsynced with their directory), then the index files. A crash after the checkpoint but
before the cut leaves the old tail readable again at the next open; the replica truncates again
before it copies (Replication.become_replica always finds the cut point anew).
"""

from __future__ import annotations

import logging
import os

from equeue_core.errors import StoreError
from equeue_core.log_copy import parse_copied, whole_records
from equeue_core.record import HEADER_SIZE, OFF_POSITION

from .atomic import write_atomic
from .constants import CHECKPOINT, END_OF_CHUNK, END_OF_CHUNK_SIZE, file_name
from .recovery import pack_checkpoint

log = logging.getLogger(__name__)


class FileReplicaLog:
    def __init__(self, store) -> None:  # store: FileMessageStore (no import cycle)
        self.store = store

    def end_position(self) -> int:
        return self.store.log.published_end

    def start_position(self) -> int:
        clog = self.store.log
        return min(clog.start, clog.published_end)

    # ------------------------------------------------------------ master side (any thread)
    def read_log(self, position: int, max_bytes: int) -> bytes:
        store = self.store
        clog = store.log
        cs = store.chunk_size
        end = clog.published_end
        if position >= end:
            if position > end:
                raise StoreError(f"position {position} is past the log end {end}")
            return b""
        if position < clog.start:
            raise StoreError(f"position {position} is below the log start {clog.start} (deleted by retention)")
        cstart = position - position % cs
        data_end = end
        if end >= cstart + cs:  # a later chunk holds the end: this one is sealed by its marker
            size = os.path.getsize(clog.path(cstart))
            data_end = cstart + size - END_OF_CHUNK_SIZE
            if clog.read_file(data_end, data_end + END_OF_CHUNK_SIZE) != END_OF_CHUNK:
                raise StoreError(f"chunk {file_name(cstart)} does not end with its end-of-chunk marker")
            if position >= data_end:
                if position > data_end:
                    raise StoreError(f"position {position} is past the records of chunk {file_name(cstart)}")
                return self.read_log(cstart + cs, max_bytes)
        head = clog.read(position, min(position + HEADER_SIZE, data_end))
        if head is None or len(head) < HEADER_SIZE or \
                int.from_bytes(head[OFF_POSITION:OFF_POSITION + 8], "little") != position:
            raise StoreError(f"position {position} is not the start of a record in this log")
        first = int.from_bytes(head[:4], "little")
        want = max(max_bytes, first)
        data = clog.read(position, min(data_end, position + want))
        if data is None:
            raise StoreError(f"position {position} is no longer stored")
        return bytes(data[:whole_records(data, want)])

    # ------------------------------------------------------------ replica side (writer thread)
    def append_log(self, position: int, data: bytes | bytearray | memoryview) -> int:
        store = self.store
        clog = store.log
        cs = store.chunk_size
        if store._broken is not None:
            raise StoreError(f"store is unusable after a failed write: {store._broken}")
        end = clog.published_end
        if position != end:
            raise StoreError(f"copy at position {position} does not continue this log (its end is {end})")
        copied = parse_copied(data, self._queue_end)
        roll = False
        if copied.start != end:
            if end % cs and copied.start == end - end % cs + cs:
                roll = True  # the master sealed its chunk at `end`
            else:
                raise StoreError(f"copied records start at position {copied.start}, this log ends at {end} "
                                 "(a gap or an overlap)")
        if copied.start % cs + (copied.end - copied.start) > cs - END_OF_CHUNK_SIZE:
            raise StoreError(f"copied records {copied.start}..{copied.end} cross a chunk boundary")
        if roll:
            clog.seal_chunk()
        elif clog.write_pos != end:
            raise StoreError(f"log write position {clog.write_pos} is not its end {end}")
        new_end = clog.write(bytes(data), copied.start)  # on failure nothing was written (StoreError)
        try:
            for run in copied.runs:
                store.index.add(run.topic, run.queue_id, run.first_offset, run.entries)
                key = (run.topic, run.queue_id)
                store._next[key] = run.first_offset + len(run.starts)
                # no store._min entry here: the index knows the queue's first offset (add() starts
                # a new queue at its first copied run). A queue this store wrote itself as a master
                # has none either, and naming the first copied offset its minimum would hide every
                # earlier record after a live demotion (truncate_log, then copies from the cut).
        except BaseException as e:
            # the log holds records part of the index lacks: refuse until a restart, whose
            # recovery rebuilds the index from the log
            store._broken = e
            raise StoreError(f"index write failed after copying records ({e}); the store needs a restart") from e
        store._last_ts = max(store._last_ts, copied.last_store_ts)
        clog.publish(new_end)
        store._flusher.written(new_end)
        return new_end

    def _queue_end(self, topic: str, queue_id: int) -> int:
        return self.store._range(topic, queue_id)[1]

    def truncate_log(self, position: int) -> None:
        store = self.store
        clog = store.log
        cs = store.chunk_size
        end = clog.published_end
        if position == end:
            return
        if position > end:
            raise StoreError(f"cannot truncate at {position}: the log ends at {end}")
        if position < clog.start:
            raise StoreError(f"cannot truncate at {position}: below the log start {clog.start}")
        head = clog.read_file(position, min(position + HEADER_SIZE, position - position % cs + cs))
        if head is None or not (head[:END_OF_CHUNK_SIZE] == END_OF_CHUNK or (
                len(head) >= HEADER_SIZE and int.from_bytes(head[OFF_POSITION:OFF_POSITION + 8], "little") == position)):
            raise StoreError(f"cannot truncate at {position}: not the start of a record")
        index = store.index
        cuts: dict[tuple[str, int], int] = {}
        for topic, qids in index.queues().items():
            for qid in qids:
                lo, hi = index.queue_range(topic, qid)
                cuts[(topic, qid)] = store._first_entry_at_or_after(topic, qid, lo, hi, position)
        with store._checkpoint_lock:
            # 1. the checkpoint vouches for nothing past the cut (see the module docstring)
            kept = min(position, max(store._checkpointed, clog.start))
            ends = {k: min(v, cuts.get(k, v)) for k, v in index.ends().items()}
            write_atomic(os.path.join(store.data_dir, CHECKPOINT), pack_checkpoint(kept, ends))
            store._checkpointed = kept
            # 2. readers stop at the cut; the index forgets the tail
            clog.published_end = position
            for (topic, qid), cut in cuts.items():
                index.truncate(topic, qid, cut)
                store._next[(topic, qid)] = cut
            # 3. the chunk files
            clog.truncate_files(position)
            index.flush()
            index.sync_all()
            with store._durability_lock:
                store._durable = min(store._durable, position)
            store._flusher.flushed = min(store._flusher.flushed, position)
            store._flusher.written(position)
            write_atomic(os.path.join(store.data_dir, CHECKPOINT), pack_checkpoint(position, index.ends()))
            store._checkpointed = position
        log.warning("commit log in %s truncated at position %d (%d bytes dropped, chunk %s)",
                    store.data_dir, position, end - position, file_name(position - position % cs))
