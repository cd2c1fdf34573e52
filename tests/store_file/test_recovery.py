"""Crash recovery: torn tails, corrupt records, lagging or leading index files, markers, checkpoint.

Each test writes real files, "crashes" the store (helpers.crash: files as written, abort marker
kept, no clean checkpoint), damages a file the way a crash or a bad disk would, reopens, and checks
what the RecoveryReport says and what reads return.
"""

from __future__ import annotations

import os

import pytest
from equeue_plugins.store_file.constants import ABORT, CHECKPOINT, END_OF_CHUNK, INDEX_DIR
from equeue_plugins.store_file.recovery import read_checkpoint

from equeue_core import record
from equeue_core.contracts import IndexRange
from equeue_core.errors import CorruptRecordError

from .helpers import (
    SMALL_CHUNK,
    append,
    append_bytes,
    chunk_paths,
    crash,
    flip_byte,
    index_file,
    open_store,
    read_all,
    records_only,
    shrink_file,
)


def test_clean_close_reopens_clean_without_scanning(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 10)
    store.close()
    assert not (tmp_path / ABORT).exists()
    assert read_checkpoint(str(tmp_path / CHECKPOINT)) == r.end_position
    store, report = open_store(tmp_path)
    assert report.clean and report.records == 0 and report.truncated_bytes == 0
    assert (tmp_path / ABORT).exists()
    store.close()


def test_truncated_tail_record_is_dropped(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r1 = append(store, 5)
    r2 = append(store, 3)
    crash(store)
    last = chunk_paths(tmp_path)[-1]
    records_only(last, r2.end_position)
    shrink_file(last, 7)  # the last record lost its last 7 bytes
    store, report = open_store(tmp_path)
    assert not report.clean
    last_size = r2.end_position - r2.positions[-1]
    assert report.truncated_bytes == last_size - 7
    assert report.records == 7
    assert store.queue_range("t", 0) == (0, 7)
    assert [m.queue_offset for m in read_all(store)] == list(range(7))
    assert last.stat().st_size == r2.positions[-1]
    r3 = append(store, 1)  # the next record takes the dropped one's place and offset
    assert (r3.first_queue_offset, r3.positions[0]) == (7, r2.positions[-1])
    assert r1.first_queue_offset == 0
    store.close()


def test_crc_mismatch_truncates_there(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 10)
    crash(store)
    chunk = chunk_paths(tmp_path)[0]
    records_only(chunk, r.end_position)
    size_before = chunk.stat().st_size
    flip_byte(chunk, r.positions[4] + record.HEADER_SIZE + 1)  # inside record 4's topic/body
    store, report = open_store(tmp_path)
    assert report.truncated_bytes == size_before - r.positions[4]
    assert store.queue_range("t", 0) == (0, 4)
    assert [m.body for m in read_all(store)] == [b"m-0", b"m-1", b"m-2", b"m-3"]
    assert any("cut" in n for n in report.notes)
    store.close()


@pytest.mark.parametrize("tail, counted", [
    ((10**6).to_bytes(4, "little") + b"\xe7\x01" + bytes(10), 6),  # a size pointing past the end
    (b"\x07" * 10 + bytes(8192), 10),  # a torn write, then the length the writer set ahead
    (bytes(4096), 0),  # zeros only: that length alone, or a file the fs extended but never wrote
], ids=["bad-length", "torn-then-zeros", "zeros-only"])
def test_bytes_after_the_last_record_are_cut_and_only_non_zero_ones_counted(tmp_path, tail, counted) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 3)
    crash(store)
    chunk = chunk_paths(tmp_path)[0]
    records_only(chunk, r.end_position)
    append_bytes(chunk, tail)
    store, report = open_store(tmp_path)
    assert chunk.stat().st_size == r.end_position
    assert store.queue_range("t", 0) == (0, 3) and report.records == 3
    assert report.truncated_bytes == counted
    assert report.notes == ([f"chunk {chunk.name}: cut {counted} bytes at offset {r.end_position}"]
                            if counted else [])
    store.close()


def test_index_rebuilt_after_crash(tmp_path) -> None:
    store, _ = open_store(tmp_path)  # index files of 64 entries: 150 entries span 3 files
    for i in range(15):
        append(store, 10, queue_id=i % 2, first_number=i * 10)
    crash(store)
    q0 = tmp_path / INDEX_DIR / "t" / "0"
    (q0 / "00000000000000000064").unlink()   # lose the newest index file of queue 0 entirely
    shrink_file(index_file(tmp_path, "t", 0, 0), 20 * 30 + 7)   # 30 entries and a torn 31st: 33 stay
    shrink_file(index_file(tmp_path, "t", 1, 64), 20 * 5)     # queue 1 lost 5 entries
    store, report = open_store(tmp_path)
    assert report.rebuilt_entries == (80 - 33) + 5
    assert store.queue_range("t", 0) == (0, 80)
    assert store.queue_range("t", 1) == (0, 70)
    msgs = read_all(store, "t", 0)
    assert [m.queue_offset for m in msgs] == list(range(80))
    assert all(m.queue_id == 0 for m in msgs)
    assert append(store, 1, queue_id=0).first_queue_offset == 80
    store.close()


def test_index_entries_past_the_log_end_are_dropped(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 5)
    r = append(store, 5)
    crash(store)
    os.truncate(chunk_paths(tmp_path)[0], r.positions[0])  # the log lost the second batch
    store, report = open_store(tmp_path)
    assert store.queue_range("t", 0) == (0, 5)
    assert any("dropped 5 entries" in n for n in report.notes)
    assert [m.queue_offset for m in read_all(store)] == list(range(5))
    r2 = append(store, 2)
    assert r2.first_queue_offset == 5 and r2.positions[0] == r.positions[0]
    store.close()
    store, report = open_store(tmp_path)
    assert report.clean and [m.queue_offset for m in read_all(store)] == list(range(7))
    store.close()


def test_torn_chunk_drops_every_later_chunk(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    results = [append(store, 40, first_number=i * 40) for i in range(40)]
    crash(store)
    paths = chunk_paths(tmp_path)
    assert len(paths) >= 3
    first = paths[0]
    assert first.read_bytes().endswith(END_OF_CHUNK)
    # the marker and one byte of the chunk's last record never reached the disk, while later
    # chunks did (write-back reordering on power loss): the log must end before that record
    size_before = first.stat().st_size
    shrink_file(first, len(END_OF_CHUNK) + 1)
    in_first = [p for r in results for p in r.positions if p < SMALL_CHUNK]
    # the newest chunk's zero tail ahead of its records is not counted as data
    later = sum(p.stat().st_size for p in paths[1:-1]) + results[-1].end_position - int(paths[-1].name)
    store, report = open_store(tmp_path)
    assert chunk_paths(tmp_path) == [first]
    assert store.queue_range("t", 0) == (0, len(in_first) - 1)
    assert first.stat().st_size == in_first[-1]
    torn_remains = size_before - len(END_OF_CHUNK) - 1 - in_first[-1]
    assert report.truncated_bytes == later + torn_remains
    assert [m.queue_offset for m in read_all(store)] == list(range(len(in_first) - 1))
    assert append(store, 1).positions[0] == in_first[-1]
    store.close()


def test_marker_without_next_chunk_is_removed_and_writing_continues(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    for i in range(40):
        append(store, 40, first_number=i * 40)
    crash(store)
    paths = chunk_paths(tmp_path)
    for p in paths[1:]:
        p.unlink()  # as if the crash hit between writing the marker and creating the next chunk
    first = paths[0]
    size = first.stat().st_size
    store, report = open_store(tmp_path)
    assert report.truncated_bytes == 0
    assert first.stat().st_size == size - len(END_OF_CHUNK)
    hi = store.queue_range("t", 0)[1]
    r = append(store, 1)
    assert r.first_queue_offset == hi
    assert [m.queue_offset for m in read_all(store)] == list(range(hi + 1))
    store.close()


def test_damaged_checkpoint_falls_back_to_a_full_scan(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 10)
    store.close()
    flip_byte(tmp_path / CHECKPOINT, 10)
    store, report = open_store(tmp_path)
    assert report.records == 10 and report.truncated_bytes == 0
    assert store.queue_range("t", 0) == (0, 10)
    store.close()


def test_recovery_scans_from_the_checkpoint_only(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 10)
    store.close()
    store, _ = open_store(tmp_path)
    append(store, 4)
    crash(store)
    store, report = open_store(tmp_path)
    assert not report.clean and report.records == 4
    assert [m.queue_offset for m in read_all(store)] == list(range(14))
    store.close()


def test_lost_index_directory_is_rebuilt_from_the_whole_log(tmp_path) -> None:
    import shutil

    store, _ = open_store(tmp_path)
    append(store, 10, queue_id=0)
    append(store, 3, queue_id=2)
    store.close()  # the checkpoint now vouches for all 13 records
    store, _ = open_store(tmp_path)
    append(store, 5, queue_id=0)
    crash(store)
    shutil.rmtree(tmp_path / INDEX_DIR)
    store, report = open_store(tmp_path)
    assert report.rebuilt_entries == 18
    assert any("rescanned the whole log" in n for n in report.notes)
    assert [m.queue_offset for m in read_all(store, "t", 0)] == list(range(15))
    assert store.queue_range("t", 2) == (0, 3)
    store.close()


def test_checkpoint_past_the_end_of_its_chunk_scans_the_whole_log(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 10)
    store.close()
    os.truncate(chunk_paths(tmp_path)[0], r.positions[8])  # "fsynced" data vanished
    store, report = open_store(tmp_path)
    assert report.records == 8
    # offsets 8 and 9 were handed out: they are reported lost and never handed out again
    assert report.lost == [IndexRange("t", 0, 8, 9)]
    assert store.queue_range("t", 0) == (0, 10)
    with pytest.raises(CorruptRecordError, match="lost"):
        store.read_queue("t", 0, 8, 10, 1 << 20)
    res = append(store, 1)
    assert (res.first_queue_offset, res.positions[0]) == (10, r.positions[8])
    store.close()
