"""The reader's trust rules on a not-yet-recovered directory, export, and where fsync runs."""

from __future__ import annotations

import os
import threading

import pytest
from equeue_plugins.store_file.reader import FileStoreReader

from equeue_core import record
from equeue_core.errors import OffsetOutOfRangeError

from .helpers import SMALL_CHUNK, append, chunk_paths, crash, flip_byte, open_store


def test_reader_stops_at_first_record_that_does_not_verify(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 10)
    crash(store)  # the broker died; nobody has recovered the directory yet
    flip_byte(chunk_paths(tmp_path)[0], r.positions[6] + record.HEADER_SIZE)
    reader = FileStoreReader(str(tmp_path), {})
    assert reader.queue_range("t", 0) == (0, 6)
    rows = [o for b in reader.export("t", 0, 0, 10) for o in b.column("queue_offset").to_pylist()]
    assert rows == list(range(6))
    reader.close()


def test_reader_export_matches_store_and_honours_batch_rows(tmp_path) -> None:
    (tmp_path / "broker.json").write_text('{"host": "127.0.0.1", "port": 9876}')
    store, _ = open_store(tmp_path)
    for i in range(30):
        append(store, 40, tag="x" if i % 2 else None, first_number=i * 40)
    store.close()
    reader = FileStoreReader(str(tmp_path), {})
    assert reader.queues() == {"t": [0]}
    batches = list(reader.export("t", 0, 100, 1000, batch_rows=256))
    assert [b.num_rows for b in batches] == [256, 256, 256, 132]
    first = batches[0].to_pylist()[0]
    assert first["queue_offset"] == 100 and first["body"] == b"m-100" and first["topic"] == "t"
    assert first["msg_id"].startswith("7F000001" + "2694")
    rows = batches[0].to_pylist()
    assert rows[0]["tag"] is None and rows[20]["tag"] == "x"  # offsets 80-119 untagged, 120-159 "x"
    ts = first["store_ts"]
    assert reader.offset_for_timestamp("t", 0, 0) == 0
    assert reader.offset_for_timestamp("t", 0, int(ts.timestamp() * 1000) + 10**7) == 1200
    reader.close()


def test_reader_after_retention_starts_at_the_first_stored_record(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    for i in range(80):
        append(store, 40, first_number=i * 40)
    store.delete_before(2 * SMALL_CHUNK)
    lo = store.queue_range("t", 0)[0]
    reader = FileStoreReader(str(tmp_path), {})
    assert reader.queue_range("t", 0) == (lo, 3200)
    with pytest.raises(OffsetOutOfRangeError):
        next(reader.export("t", 0, 0, 10))
    assert next(reader.export("t", 0, lo, lo + 5)).column("queue_offset").to_pylist() == list(range(lo, lo + 5))
    reader.close()
    store.close()


def test_fsync_never_runs_on_the_appending_thread(tmp_path, monkeypatch) -> None:
    callers: list[int] = []
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def fdatasync(fd: int) -> None:  # records the thread, then does the real fdatasync
        callers.append(threading.get_ident())
        real_fdatasync(fd)

    def fsync(fd: int) -> None:
        callers.append(threading.get_ident())
        real_fsync(fd)

    store, _ = open_store(tmp_path, flush="sync")
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "fsync", fsync)
    futures = [store.wait_flushed(append(store, 5).end_position) for _ in range(20)]
    for f in futures:
        f.result(timeout=10)
    assert callers and threading.get_ident() not in callers
    monkeypatch.undo()
    store.close()


def test_async_flush_resolves_waiters_within_the_interval(tmp_path) -> None:
    store, _ = open_store(tmp_path, flush="async")
    r = append(store, 5)
    store.wait_flushed(r.end_position).result(timeout=5)
    assert store.wait_flushed(r.end_position).done()
    store.close()
