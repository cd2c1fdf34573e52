"""The chunk being written is longer than its records (commit_log.py): its length is set up to
LENGTH_AHEAD bytes past them, so an append changes no file length and the fdatasync that makes it
durable has no inode to write. These tests pin what that promises: zero bytes past the records,
at most chunk_size, a sealed chunk and a cleanly closed one exactly as long as their records, and
a crash's zero tail cut by recovery without being reported as torn data (test_recovery.py and
test_processes.py have the damaged and the SIGKILL cases)."""

from __future__ import annotations

from equeue_plugins.store_file.constants import END_OF_CHUNK, LENGTH_AHEAD

from .helpers import SMALL_CHUNK, append, append_bytes, chunk_paths, crash, open_store, read_all

BIG_CHUNK = 64 * 1024 * 1024


def test_an_append_changes_no_file_length_while_the_length_ahead_has_room(tmp_path) -> None:
    store, _ = open_store(tmp_path, chunk_size=BIG_CHUNK)
    chunk = None
    lengths = set()
    for i in range(200):
        r = append(store, 3, first_number=i * 3)
        chunk = chunk or chunk_paths(tmp_path)[0]
        lengths.add(chunk.stat().st_size)
        assert chunk.stat().st_size >= r.end_position + LENGTH_AHEAD // 2
    assert len(lengths) == 1, f"the file length changed with appends: {sorted(lengths)}"
    with open(chunk, "rb") as f:
        f.seek(r.end_position)
        assert f.read(64 * 1024) == bytes(64 * 1024), "the bytes past the records must be zero"
    assert [m.body for m in read_all(store)][-1] == b"m-599"
    store.close()


def test_the_length_ahead_stops_at_the_chunk_size(tmp_path) -> None:
    store, _ = open_store(tmp_path)  # 64 KiB chunks: far less than LENGTH_AHEAD
    for i in range(150):
        append(store, 20, first_number=i * 20)
        assert all(p.stat().st_size <= SMALL_CHUNK for p in chunk_paths(tmp_path))
    assert len(chunk_paths(tmp_path)) >= 3
    store.close()


def test_a_roll_cuts_the_sealed_chunk_right_after_its_marker(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    results = [append(store, 20, first_number=i * 20) for i in range(150)]
    paths = chunk_paths(tmp_path)
    assert len(paths) >= 3
    for sealed in paths[:-1]:  # while the store is open, before any close could cut them
        start = int(sealed.name)
        last = max(p for r in results for p in r.positions if start <= p < start + SMALL_CHUNK)
        data = sealed.read_bytes()
        assert data.endswith(END_OF_CHUNK) and len(data) > last - start
        # nothing but the marker after the chunk's last record
        assert len(data) == data.rindex(END_OF_CHUNK) + len(END_OF_CHUNK)
    store.close()


def test_a_clean_close_cuts_the_chunk_to_its_records(tmp_path) -> None:
    store, _ = open_store(tmp_path, chunk_size=BIG_CHUNK)
    r = append(store, 10)
    chunk = chunk_paths(tmp_path)[0]
    assert chunk.stat().st_size > r.end_position
    store.close()
    assert chunk.stat().st_size == r.end_position
    store, report = open_store(tmp_path, chunk_size=BIG_CHUNK)
    assert report.clean and report.truncated_bytes == 0
    r2 = append(store, 1, first_number=10)
    assert r2.positions[0] == r.end_position and chunk.stat().st_size > r2.end_position
    store.close()


def test_a_crash_leaves_the_zero_tail_and_recovery_cuts_it_as_no_loss(tmp_path) -> None:
    store, _ = open_store(tmp_path, chunk_size=BIG_CHUNK)
    r = append(store, 10)
    crash(store)
    chunk = chunk_paths(tmp_path)[0]
    assert chunk.stat().st_size > r.end_position  # what a killed writer leaves
    store, report = open_store(tmp_path, chunk_size=BIG_CHUNK)
    assert not report.clean
    assert report.truncated_bytes == 0 and report.notes == [] and report.records == 10
    assert [m.body for m in read_all(store)] == [b"m-%d" % i for i in range(10)]
    r2 = append(store, 1, first_number=10)  # writing goes on at the records' end
    assert r2.positions[0] == r.end_position
    store.close()


def test_a_sealed_chunk_whose_cut_was_lost_is_cut_at_its_marker_by_recovery(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    results = [append(store, 20, first_number=i * 20) for i in range(150)]
    crash(store)
    first = chunk_paths(tmp_path)[0]
    exact = first.stat().st_size
    # a power loss after the roll made the next chunk, before the roll's cut of this one reached
    # the disk: the sealed chunk still has its zero tail
    append_bytes(first, bytes(4096))
    store, report = open_store(tmp_path)
    assert first.stat().st_size == exact and first.read_bytes().endswith(END_OF_CHUNK)
    assert report.truncated_bytes == 0 and report.notes == []
    total = sum(len(r.positions) for r in results)
    assert [m.body for m in read_all(store)] == [b"m-%d" % i for i in range(total)]
    store.close()
