"""Tiny helpers for the file-store tests: build batches, open/crash/reopen a store, damage files.

"Crash" here means: stop the store the way a killed process leaves it (abort marker present,
checkpoint not advanced, nothing written at close), while the bytes already written stay in the
files, exactly as after kill -9. The SIGKILL test does the real thing in a subprocess.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from equeue_plugins.store_file.constants import COMMITLOG_DIR, INDEX_DIR, file_name
from equeue_plugins.store_file.queue_index import FileQueueIndex
from equeue_plugins.store_file.store import FileMessageStore

from equeue_core import record
from equeue_core.contracts import StoreSettings

SMALL_CHUNK = 64 * 1024


def settings(path: Path, flush: str = "async", **options: object) -> StoreSettings:
    opts: dict[str, object] = {"chunk_size": SMALL_CHUNK, "index_file_entries": 64}
    opts.update(options)
    return StoreSettings(str(path), flush=flush, flush_interval_ms=50, options=opts)


def open_store(path: Path, flush: str = "async", **options: object) -> tuple[FileMessageStore, object]:
    s = settings(path, flush, **options)
    store = FileMessageStore(s, FileQueueIndex(s))
    report = store.open()
    return store, report


def make_batch(n: int, topic: str = "t", body: bytes = b"m", tag: str | None = None,
               first_number: int = 0) -> tuple[bytearray, list[int]]:
    """n records whose bodies are body + b"-<number>", numbered from first_number."""
    buf = bytearray(b"".join(record.encode_record(topic, body + b"-%d" % (first_number + i), tag=tag)
                             for i in range(n)))
    return buf, record.scan(buf)


def append(store: FileMessageStore, n: int, topic: str = "t", queue_id: int = 0, **kw: object):
    buf, starts = make_batch(n, topic, **kw)  # type: ignore[arg-type]
    return store.append(topic, queue_id, buf, starts)


def append_in_turn(store: FileMessageStore, queues: int, rounds: int, n: int,
                   body: Callable[[int], bytes] = lambda q: b"m") -> list:
    """Queues 0..queues-1 of topic "t" appended in turn, n records at a time, `rounds` times: a
    queue's records lie in the log in runs of n, numbered from 0 in each queue (body(q) + b"-k").
    The append results, in order."""
    return [append(store, n, queue_id=i % queues, body=body(i % queues), first_number=(i // queues) * n)
            for i in range(queues * rounds)]


def bodies(records: bytes | bytearray | memoryview) -> list[bytes]:
    return [m.body for m in record.iter_records(records)]


def read_all(store: FileMessageStore, topic: str = "t", queue_id: int = 0) -> list[record.StoredMessage]:
    lo, hi = store.queue_range(topic, queue_id)
    out: list[record.StoredMessage] = []
    off = lo
    for _ in range(10_000):
        if off >= hi:
            break
        r = store.read_queue(topic, queue_id, off, 256, 1 << 24)
        out.extend(record.iter_records(r.records))
        off = r.next_offset
    return out


def crash(store: FileMessageStore) -> None:
    """Leave the store as a killed process would: files as written, abort marker kept."""
    # end the checkpointer and the flusher without a final flush/checkpoint: a killed process
    # gets neither
    store._stop_checkpoints.set()
    store._checkpointer.join()
    store._flusher._flush_fn = lambda: 0
    store._flusher.stop()
    store.log.release_files()  # without close()'s cut of the zero tail ahead of the records
    idx = store.index
    for q in idx._queues.values():  # close fds without the clean-close bookkeeping
        fds = q.sealed + ([q.fd] if q.fd >= 0 else []) + list(q.read_fds.values())
        for fd in fds:
            os.close(fd)
        q.sealed, q.fd, q.read_fds = [], -1, {}
    idx._closed = True
    store._closed = True
    store._release_lock()  # the kernel drops a dead process's locks


def chunk_paths(path: Path) -> list[Path]:
    return sorted((path / COMMITLOG_DIR).iterdir())


def index_file(path: Path, topic: str, queue_id: int, first: int) -> Path:
    return path / INDEX_DIR / topic / str(queue_id) / file_name(first)


def flip_byte(file: Path, offset: int) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def records_only(chunk: Path, end: int) -> None:
    """Cut a chunk file at `end` (a position) after crash(): exactly its records, as a writer
    without the length set ahead of them left its files (or a crash before that length reached
    the disk), so a test can damage the records' end itself."""
    os.truncate(chunk, end - int(chunk.name))


def shrink_file(file: Path, by: int) -> None:
    os.truncate(file, max(0, file.stat().st_size - by))


def append_bytes(file: Path, data: bytes) -> None:
    with open(file, "ab") as f:
        f.write(data)


def fix_crc(file: Path, record_at: int) -> None:
    """Recompute the crc of the record at byte record_at of a chunk file, so a damaged field is
    caught by a deeper check (the stamped position, the index's size) rather than the crc."""
    with open(file, "r+b") as f:
        f.seek(record_at)
        size = int.from_bytes(f.read(4), "little")
        f.seek(record_at)
        rec = bytearray(f.read(size))
        rec[record.OFF_CRC:record.OFF_CRC + 4] = record.crc32c(bytes(rec[record.CRC_FROM:])).to_bytes(4, "little")
        f.seek(record_at)
        f.write(rec)


def chunk_and_offset(path: Path, position: int, chunk_size: int = SMALL_CHUNK) -> tuple[Path, int]:
    """The chunk file holding a log position, and the position's byte offset in it."""
    return path / COMMITLOG_DIR / file_name(position - position % chunk_size), position % chunk_size
