"""Appending, reading, ranges, tag filters, roll-over and retention on real files."""

from __future__ import annotations

import time

import pytest
from equeue_plugins.store_file.constants import END_OF_CHUNK, file_name

from equeue_core import record
from equeue_core.errors import InvalidMessageError, MessageNotFoundError, OffsetOutOfRangeError
from equeue_core.plugins import PluginManager

from .helpers import (
    SMALL_CHUNK,
    append,
    append_in_turn,
    bodies,
    chunk_paths,
    make_batch,
    open_store,
    read_all,
)


def test_plugin_registers_file_for_every_storage_hook() -> None:
    pm = PluginManager()
    for hook in ("equeue_store_engines", "equeue_store_readers"):
        assert "file" in pm.names(hook)


def test_append_assigns_consecutive_offsets_and_positions(tmp_path) -> None:
    store, report = open_store(tmp_path)
    assert report.clean and report.truncated_bytes == 0
    r1 = append(store, 3)
    r2 = append(store, 2)
    assert r1.first_queue_offset == 0 and r2.first_queue_offset == 3
    assert r2.positions[0] == r1.end_position
    msgs = read_all(store)
    assert [m.queue_offset for m in msgs] == [0, 1, 2, 3, 4]
    assert [m.position for m in msgs] == r1.positions + r2.positions
    assert [m.body for m in msgs] == [b"m-0", b"m-1", b"m-2", b"m-0", b"m-1"]
    assert all(m.store_ts > 0 for m in msgs)
    store.close()


def test_queues_are_independent(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 2, queue_id=0)
    append(store, 5, queue_id=1)
    append(store, 1, topic="other", queue_id=3)
    assert store.queue_range("t", 0) == (0, 2)
    assert store.queue_range("t", 1) == (0, 5)
    assert store.queues() == {"other": [3], "t": [0, 1]}
    assert [m.queue_id for m in read_all(store, "t", 1)] == [1] * 5
    store.close()


def test_offset_at_max_is_empty_and_outside_range_raises(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 4)
    r = store.read_queue("t", 0, 4, 32, 1 << 20)
    assert (r.count, r.next_offset, r.min_offset, r.max_offset, bytes(r.records)) == (0, 4, 0, 4, b"")
    with pytest.raises(OffsetOutOfRangeError) as e:
        store.read_queue("t", 0, 5, 32, 1 << 20)
    assert (e.value.min_offset, e.value.max_offset) == (0, 4)
    with pytest.raises(OffsetOutOfRangeError):
        store.read_queue("t", 0, -1, 32, 1 << 20)
    assert store.read_queue("never", 0, 0, 32, 1 << 20).count == 0
    store.close()


def test_max_bytes_limits_a_pull_but_never_below_one_record(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 10)
    size = r.positions[1] - r.positions[0]
    pull = store.read_queue("t", 0, 0, 32, size * 3 + 1)
    assert pull.count == 3 and pull.next_offset == 3
    pull = store.read_queue("t", 0, 0, 32, 1)
    assert pull.count == 1 and pull.next_offset == 1
    store.close()


def test_tag_filter_skips_other_tags_and_moves_next_offset_past_them(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    for i in range(6):
        append(store, 1, tag="a" if i % 3 == 0 else "b", first_number=i)
    want = frozenset({record.tag_hash("a")})
    pull = store.read_queue("t", 0, 0, 32, 1 << 20, want)
    assert bodies(pull.records) == [b"m-0", b"m-3"]
    assert pull.next_offset == 6
    pull = store.read_queue("t", 0, 0, 1, 1 << 20, want)
    assert pull.count == 1 and pull.next_offset == 1
    pull = store.read_queue("t", 0, 1, 1, 1 << 20, want)
    assert bodies(pull.records) == [b"m-3"] and pull.next_offset == 4
    none = store.read_queue("t", 0, 4, 32, 1 << 20, frozenset({record.tag_hash("zzz")}))
    assert none.count == 0 and none.next_offset == 6
    store.close()


def test_chunk_rollover(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    results = [append(store, 40, queue_id=i % 2, first_number=i * 40) for i in range(80)]
    paths = chunk_paths(tmp_path)
    assert len(paths) >= 4
    assert [p.name for p in paths] == [file_name(i * SMALL_CHUNK) for i in range(len(paths))]
    for p in paths[:-1]:  # every sealed chunk ends with exactly one end-of-chunk marker
        data = p.read_bytes()
        assert data.endswith(END_OF_CHUNK) and len(data) <= SMALL_CHUNK
    for r in results:  # no batch spans chunks
        assert r.positions[0] // SMALL_CHUNK == (r.end_position - 1) // SMALL_CHUNK
    q0 = read_all(store, "t", 0)
    assert [m.queue_offset for m in q0] == list(range(1600))
    assert [m.body for m in q0[:20]] == [b"m-%d" % i for i in range(20)]
    pos = results[-1].positions[-1]
    assert record.decode(store.read_position(pos)).position == pos
    store.close()
    store, report = open_store(tmp_path)
    assert report.clean and report.truncated_bytes == 0
    assert store.queue_range("t", 1) == (0, 1600)
    r = append(store, 1, queue_id=1)
    assert r.first_queue_offset == 1600 and r.positions[0] == results[-1].end_position
    store.close()


def test_batch_larger_than_a_chunk_is_refused(tmp_path) -> None:
    store, _ = open_store(tmp_path, chunk_size=4096)
    buf, starts = make_batch(1, body=b"x" * 5000)
    with pytest.raises(InvalidMessageError):
        store.append("t", 0, buf, starts)
    assert store.queue_range("t", 0) == (0, 0)
    store.close()


def test_read_position_rejects_anything_but_a_record_start(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    r = append(store, 3)
    for p in r.positions:
        assert record.decode(store.read_position(p)).position == p
    for bad in (r.positions[1] + 1, r.end_position, r.end_position + 10_000, -1):
        with pytest.raises(MessageNotFoundError):
            store.read_position(bad)
    store.close()


def test_ring_miss_falls_back_to_mapped_chunks(tmp_path) -> None:
    store, _ = open_store(tmp_path, ring_bytes=4 * 64 * 1024, chunk_size=1 << 20)
    for i in range(40):
        append(store, 50, body=b"m" * 100, first_number=i * 50)
    assert store.log.ring.read(0, 100) is None  # lapped: the oldest bytes are no longer in the ring
    msgs = read_all(store)
    assert [m.body for m in msgs] == [b"m" * 100 + b"-%d" % i for i in range(2000)]
    assert store.log.mapped_bytes() > 0
    store.close()


def test_offset_for_timestamp_finds_first_at_or_after(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 5)
    msgs = read_all(store)
    ts = msgs[0].store_ts
    assert store.offset_for_timestamp("t", 0, 0) == 0
    assert store.offset_for_timestamp("t", 0, ts) == 0
    assert store.offset_for_timestamp("t", 0, ts + 10**9) == 5
    store.close()


def test_retention_deletes_whole_chunks_and_moves_min_offset(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    results = [append(store, 40, first_number=i * 40) for i in range(80)]
    chunks_before = chunk_paths(tmp_path)
    cut = 2 * SMALL_CHUNK + 100
    released = store.delete_before(cut)
    after = chunk_paths(tmp_path)
    assert released > 0 and len(after) == len(chunks_before) - 2
    assert after[0].name == file_name(2 * SMALL_CHUNK)
    first_kept = next(r for r in results if r.positions[0] >= 2 * SMALL_CHUNK).first_queue_offset
    lo, hi = store.queue_range("t", 0)
    assert (lo, hi) == (first_kept, 3200)
    with pytest.raises(OffsetOutOfRangeError) as e:
        store.read_queue("t", 0, 0, 10, 1 << 20)
    assert e.value.min_offset == first_kept
    with pytest.raises(MessageNotFoundError):
        store.read_position(results[0].positions[0])
    assert record.decode(store.read_queue("t", 0, lo, 1, 1 << 20).records).queue_offset == lo
    assert store.delete_before(10**12) > 0  # never the chunk being written
    assert len(chunk_paths(tmp_path)) == 1
    store.close()
    store, _ = open_store(tmp_path)
    lo2, hi2 = store.queue_range("t", 0)
    assert hi2 == 3200 and lo2 > first_kept
    assert append(store, 1).first_queue_offset == 3200
    store.close()


def test_idle_chunk_maps_are_dropped_above_the_low_watermark(tmp_path) -> None:
    store, _ = open_store(tmp_path, ring_bytes=0, map_low_bytes=0, map_idle_seconds=0.05)
    for i in range(80):
        append(store, 40, first_number=i * 40)
    assert len(read_all(store)) == 3200
    assert store.log.mapped_bytes() > 0
    deadline = time.monotonic() + 5
    while store.log.mapped_bytes() and time.monotonic() < deadline:
        time.sleep(0.06)
        store.log.sweep_maps()
    assert store.log.mapped_bytes() == 0
    assert len(read_all(store)) == 3200  # and they map again on demand
    store.close()


def test_no_new_maps_above_the_high_watermark(tmp_path) -> None:
    store, _ = open_store(tmp_path, ring_bytes=0, map_high_bytes=1)
    for i in range(80):
        append(store, 40, first_number=i * 40)
    msgs = read_all(store)
    assert [m.body for m in msgs] == [b"m-%d" % i for i in range(3200)]  # served by pread
    assert store.log.mapped_bytes() <= SMALL_CHUNK
    store.close()


_RUNS = 160  # runs of each queue in _interleaved_store, 5 records each


def _interleaved_store(tmp_path, **options):
    """Three queues appended in turn, 5 records at a time, ~670 KB over eleven 64 KiB chunks: a
    pull of one queue is many runs, in many chunks."""
    store, _ = open_store(tmp_path, **options)
    append_in_turn(store, 3, _RUNS, 5, lambda q: b"q%d-" % q + b"m" * 200)
    assert len(store.log.chunks) >= 3
    return store


@pytest.mark.parametrize("ring_bytes", [0, 4 * 64 * 1024])
def test_a_pull_s_runs_are_one_copy_of_the_same_bytes_from_the_chunks_and_the_ring(
        tmp_path, ring_bytes) -> None:
    """A pull's runs in one join (CommitLog.read_runs), byte for byte what reading them one by
    one gives, across a chunk roll too: without a ring all out of the mapped chunks; with a ring
    of four pages the newest out of the ring and the older ones out of the chunks."""
    from equeue_core.record import index_runs

    store = _interleaved_store(tmp_path, ring_bytes=ring_bytes)
    lo, hi = store.queue_range("t", 1)
    entries = store.index.read("t", 1, lo, hi - lo)
    runs, count, _ = index_runs(entries, hi - lo, 1 << 30, None)
    assert count == 5 * _RUNS and len(runs) == _RUNS
    cs = store.log.chunk_size
    assert len({a - a % cs for a, _ in runs}) >= 3  # the runs lie in three chunks or more
    assert store.log.ring.read(*runs[0]) is None
    assert (store.log.ring.read(*runs[-1]) is not None) == bool(ring_bytes)
    if ring_bytes:  # what the ring holds is read from it, mapping no more of the chunks
        held = [r for r in runs if store.log.ring.read(*r) is not None]
        assert 2 <= len(held) < len(runs)
        mapped = store.log.mapped_bytes()
        assert store.log.read_runs(held) == b"".join(store.log.ring.read(*r) for r in held)
        assert store.log.mapped_bytes() == mapped
    joined = store.log.read_runs(runs)
    assert joined == b"".join(store.log.read(a, b) for a, b in runs)
    assert [m.body for m in record.iter_records(joined)] == [b"q1-" + b"m" * 200 + b"-%d" % n for n in range(5 * _RUNS)]
    for q in range(3):  # and through read_queue, a pull at a time
        assert [m.body for m in read_all(store, "t", q)] == [b"q%d-" % q + b"m" * 200 + b"-%d" % n
                                                             for n in range(5 * _RUNS)]
    store.close()


def test_a_pull_s_runs_are_read_one_by_one_when_their_chunks_cannot_be_mapped(tmp_path) -> None:
    """Above the maps' high watermark read_runs gives up (None) and read_queue reads the runs
    one by one (pread): the same records. A chunk deleted by retention gives None too."""
    from equeue_core.record import index_runs

    store = _interleaved_store(tmp_path, ring_bytes=0, map_high_bytes=1)
    lo, hi = store.queue_range("t", 2)
    runs, _, _ = index_runs(store.index.read("t", 2, lo, hi - lo), hi - lo, 1 << 30, None)
    assert store.log.read_runs(runs) is None  # the first chunk maps, the next may not
    assert [m.body for m in read_all(store, "t", 2)] == [b"q2-" + b"m" * 200 + b"-%d" % n for n in range(5 * _RUNS)]
    store.close()

    store = _interleaved_store(tmp_path / "deleted", ring_bytes=0)
    lo, hi = store.queue_range("t", 0)
    runs, _, _ = index_runs(store.index.read("t", 0, lo, hi - lo), hi - lo, 1 << 30, None)
    assert store.delete_before(store.log.chunk_size + 1) > 0  # retention takes the first chunk
    assert store.log.read_runs(runs) is None  # the runs read before it: not all stored now
    assert store.log.read_runs([r for r in runs if r[0] >= store.log.chunk_size]) is not None
    store.close()


def test_ring_slot_holding_a_newer_lap_is_not_served() -> None:
    from equeue_plugins.store_file.constants import RING_PAGE
    from equeue_plugins.store_file.ring import Ring

    ring = Ring(4 * RING_PAGE)
    data = bytes(range(256)) * (RING_PAGE // 256)
    for page in range(4):
        ring.write(page * RING_PAGE, data)
    assert ring.read(10, 20) == data[10:20]
    assert ring.read(RING_PAGE - 5, RING_PAGE + 5) == data[-5:] + data[:5]  # across two slots
    ring.write(4 * RING_PAGE, data)  # the next lap takes slot 0
    assert ring.read(10, 20) is None
    assert ring.read(4 * RING_PAGE + 10, 4 * RING_PAGE + 20) == data[10:20]
    assert ring.read(0, 4 * RING_PAGE) is None  # more than the ring can vouch for


def test_a_pull_s_spans_come_out_of_the_ring_in_one_read_only_while_the_ring_holds_every_one() -> None:
    from equeue_plugins.store_file.constants import RING_PAGE
    from equeue_plugins.store_file.ring import Ring

    ring = Ring(4 * RING_PAGE)
    data = bytes(range(256)) * (RING_PAGE // 256)
    for page in range(4):
        ring.write(page * RING_PAGE, data)
    runs = [(10, 20), (RING_PAGE - 5, RING_PAGE + 5), (3 * RING_PAGE, 3 * RING_PAGE + 7)]
    assert ring.read_runs(runs) == b"".join(ring.read(a, b) for a, b in runs)
    ring.write(4 * RING_PAGE, data)  # the next lap takes slot 0: the first span is gone
    assert ring.read_runs(runs) is None
    assert ring.read_runs(runs[1:]) is None  # its second span starts in slot 0 too
    assert ring.read_runs(runs[2:] + [(4 * RING_PAGE + 1, 4 * RING_PAGE + 3)]) == data[:7] + data[1:3]
    assert Ring(0).read_runs(runs) is None


@pytest.mark.parametrize("ring_bytes", [64 * 1024 * 1024, 4 * 64 * 1024])
def test_a_queue_among_others_reads_back_its_own_records_in_order_from_the_ring_or_the_chunks(
        tmp_path, ring_bytes) -> None:
    """Three queues appended in turn: each queue's records lie in the log in spans of 7, and a
    pull of one takes many spans (one read out of the ring for all of them while it holds them,
    the chunks for a ring lapped meanwhile): the same records, in order, either way."""
    store, _ = open_store(tmp_path, ring_bytes=ring_bytes, chunk_size=1 << 20)
    append_in_turn(store, 3, 100, 7, lambda q: b"q%d-" % q + b"m" * 60)
    for q in range(3):
        msgs = read_all(store, "t", q)
        assert [m.queue_offset for m in msgs] == list(range(700))
        assert [m.body for m in msgs] == [b"q%d-" % q + b"m" * 60 + b"-%d" % n for n in range(700)]
    store.close()


def test_ring_first_write_inside_a_page_does_not_vouch_for_the_bytes_before_it() -> None:
    """After a restart the ring is empty and the first append starts mid-page: the records before
    it in that page were recovered from disk, never written to the ring, and must not be served
    from it (they were served as zeros: a new consumer group stalled after a kill -9 restart)."""
    from equeue_plugins.store_file.constants import RING_PAGE
    from equeue_plugins.store_file.ring import Ring

    ring = Ring(4 * RING_PAGE)
    restart_at = 5 * RING_PAGE + 1000  # the recovered log ends here
    ring.write(restart_at, b"x" * 100)
    assert ring.read(5 * RING_PAGE + 10, 5 * RING_PAGE + 20) is None  # before the restart: not held
    assert ring.read(restart_at, restart_at + 100) is None  # its page is not whole: from the chunk
    ring.write(restart_at + 100, b"y" * RING_PAGE)  # completes page 5, fills the start of page 6
    assert ring.read(5 * RING_PAGE + 10, 5 * RING_PAGE + 20) is None
    assert ring.read(6 * RING_PAGE, 6 * RING_PAGE + 10) == b"y" * 10  # a page written from its start


@pytest.mark.parametrize("queues", [1, 2])
def test_reads_on_other_threads_never_see_a_torn_record_while_appending(tmp_path, queues) -> None:
    """Readers of queue 0 while appends lap a small ring; with two queues appended in turn a
    pull of queue 0 is many spans (read out of the ring in one call, record.gather_runs)."""
    import threading

    store, _ = open_store(tmp_path, ring_bytes=4 * 64 * 1024)  # a small ring: laps and misses
    stop = threading.Event()
    problems: list[str] = []

    def reader() -> None:
        off = 0
        deadline = time.monotonic() + 10
        while not stop.is_set() and time.monotonic() < deadline:
            r = store.read_queue("t", 0, off, 64, 1 << 20)
            for s in record.scan(r.records):
                try:
                    record.verify(r.records, s)
                except Exception as e:  # reported by the test thread below
                    problems.append(f"offset {off}: {e}")
                    return
                m = record.decode(r.records, s)
                if m.queue_offset != off or m.body != b"m" * 50 + b"-%d" % off:
                    problems.append(f"offset {off}: got {m.queue_offset} {m.body[-8:]!r}")
                    return
                off += 1

    def guarded_reader() -> None:
        try:
            reader()
        except Exception as e:  # any error in a reader thread fails the test
            problems.append(repr(e))

    threads = [threading.Thread(target=guarded_reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(300):
            append(store, 20, body=b"m" * 50, first_number=i * 20)
            if queues > 1:
                append(store, 20, queue_id=1, body=b"n" * 50)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
    assert not problems
    assert [m.queue_offset for m in read_all(store)] == list(range(6000))
    store.close()


def test_second_writer_on_the_same_directory_is_refused(tmp_path) -> None:
    from equeue_core.errors import StoreError

    store, _ = open_store(tmp_path)
    with pytest.raises(StoreError, match="open for writing by process"):
        open_store(tmp_path)
    store.close()
    again, _ = open_store(tmp_path)
    again.close()


def test_index_reads_of_the_last_small_add_agree_with_the_files_and_never_go_stale(tmp_path) -> None:
    """The entries of a queue's last small add are read from memory (a held pull woken by that
    add): the same bytes a reader of the files gets, for any offset and count inside them, and
    nothing of them once the index is truncated there (an undone append) and written anew."""
    from equeue_plugins.store_file.queue_index import TAIL_ENTRIES, FileQueueIndex

    from .helpers import settings

    store, _ = open_store(tmp_path)
    index = store.index
    files = FileQueueIndex(settings(tmp_path), read_only=True)
    for n in (1, 3, TAIL_ENTRIES, TAIL_ENTRIES + 1, 2):
        append(store, n)
    lo, hi = index.queue_range("t", 0)
    assert index._queues[("t", 0)].tail is not None  # the last add (2 entries) is kept
    for offset in range(max(lo, hi - 40), hi):
        for count in (1, 2, 5, 64):
            assert bytes(index.read("t", 0, offset, count)) == bytes(files.read("t", 0, offset, count))
    before = bytes(index.read("t", 0, hi - 2, 2))
    index.truncate("t", 0, hi - 2)
    assert bytes(index.read("t", 0, hi - 2, 2)) == b""
    other = bytes(b ^ 0xFF for b in before)
    index.add("t", 0, hi - 2, other)
    assert bytes(index.read("t", 0, hi - 2, 2)) == other == bytes(files.read("t", 0, hi - 2, 2))
    files.close()
    store.close()
