"""Append and read: what a producer stores is what a consumer gets, byte for byte, in order."""

from __future__ import annotations

import pytest

from equeue_core import record
from equeue_core.contracts import MessageStore, QueueIndex, RecoveryReport
from equeue_core.errors import MessageNotFoundError, OffsetOutOfRangeError

from .kit import append, check_message, make_batch, read_all, verified_messages

T = "orders"


def test_store_objects_satisfy_the_kernel_contracts(harness):
    h = harness.open()
    assert isinstance(h.store, MessageStore)
    assert isinstance(h.index, QueueIndex)
    assert isinstance(h.report, RecoveryReport)


def test_batch_append_assigns_consecutive_offsets_and_increasing_positions(harness):
    h = harness.open()
    results = [append(h, T, 0, n) for n in (1, 1000, 7)]
    assert [r.first_queue_offset for r in results] == [0, 1, 1001]
    positions = [p for r in results for p in r.positions]
    assert len(positions) == 1008
    assert all(a < b for a, b in zip(positions, positions[1:], strict=False)), "positions must increase"
    assert all(p < results[-1].end_position for p in positions)
    assert h.store.queue_range(T, 0) == (0, 1008)
    h.store.wait_flushed(results[-1].end_position).result(timeout=10)


def test_read_by_queue_offset_returns_the_stamped_bytes_intact(harness):
    h = harness.open()
    buf, starts = make_batch(T, 2, 0, 50)
    res = h.store.append(T, 2, buf, starts)
    stamped = [bytes(buf[s:s + record.record_size(buf, s)]) for s in starts]
    pulled = h.store.read_queue(T, 2, 0, 100, 1 << 24)
    assert (pulled.count, pulled.next_offset, pulled.min_offset, pulled.max_offset) == (50, 50, 0, 50)
    got = bytes(pulled.records)
    assert got == b"".join(stamped), "stored bytes differ from what stamp_batch produced"
    for i, msg in enumerate(verified_messages(got)):
        check_message(msg, T, 2, i)
        assert msg.position == res.positions[i]
        assert msg.store_ts > 0


def test_read_by_position_returns_the_same_record(harness):
    h = harness.open()
    res = append(h, T, 0, 20)
    pulled = bytes(h.store.read_queue(T, 0, 0, 20, 1 << 24).records)
    for i, s in enumerate(record.scan(pulled)):
        one = h.store.read_position(res.positions[i])
        assert bytes(one) == pulled[s:s + record.record_size(pulled, s)]


def test_read_position_past_the_end_raises_message_not_found(harness):
    h = harness.open()
    res = append(h, T, 0, 3)
    with pytest.raises(MessageNotFoundError):
        h.store.read_position(res.end_position + 10_000)


def test_queues_do_not_share_offsets(harness):
    h = harness.open()
    for _ in range(3):
        for topic, qid in ((T, 0), (T, 3), ("audit", 1)):
            append(h, topic, qid, 4)
    assert h.store.queues() == {T: [0, 3], "audit": [1]}
    for topic, qid in ((T, 0), (T, 3), ("audit", 1)):
        assert h.store.queue_range(topic, qid) == (0, 12)
        for i, msg in enumerate(read_all(h.store, topic, qid, 0, 12)):
            check_message(msg, topic, qid, i)


def test_tag_filter_serves_only_matches_and_next_offset_skips_the_scanned(harness):
    h = harness.open()
    append(h, T, 0, 300)
    wanted = frozenset({record.tag_hash("a")})  # offsets 0, 3, 6 ...
    res = h.store.read_queue(T, 0, 0, 5, 1 << 24, wanted)
    msgs = verified_messages(res.records)
    assert [m.queue_offset for m in msgs] == [0, 3, 6, 9, 12]
    assert res.count == 5
    assert 12 < res.next_offset <= 15, "next_offset must pass the last match, but not skip unscanned ones"
    # Following next_offset serves every match exactly once and ends at the max offset.
    msgs = read_all(h.store, T, 0, 0, 300, wanted, max_count=7)
    assert [m.queue_offset for m in msgs] == list(range(0, 300, 3))
    assert all(m.tag == "a" for m in msgs)


def test_filter_matching_nothing_still_advances_to_the_max_offset(harness):
    h = harness.open()
    append(h, T, 0, 120)
    nothing = frozenset({record.tag_hash("no-such-tag")})
    assert read_all(h.store, T, 0, 0, 120, nothing) == []


def test_max_count_and_max_bytes_bound_a_pull(harness):
    h = harness.open()
    append(h, T, 0, 30)
    res = h.store.read_queue(T, 0, 4, 3, 1 << 24)
    assert (res.count, res.next_offset) == (3, 7)
    sizes = [m for m in record.scan(bytes(h.store.read_queue(T, 0, 10, 3, 1 << 24).records))]
    full = bytes(h.store.read_queue(T, 0, 10, 3, 1 << 24).records)
    two = record.record_size(full, sizes[0]) + record.record_size(full, sizes[1])
    res = h.store.read_queue(T, 0, 10, 10, two)
    assert (res.count, res.next_offset) == (2, 12)
    assert bytes(res.records) == full[:two]


def test_offset_above_max_raises_and_offset_at_max_is_empty(harness):
    h = harness.open()
    append(h, T, 0, 10)
    res = h.store.read_queue(T, 0, 10, 32, 1 << 20)
    assert (res.count, res.next_offset, res.max_offset) == (0, 10, 10)
    with pytest.raises(OffsetOutOfRangeError) as e:
        h.store.read_queue(T, 0, 11, 32, 1 << 20)
    assert (e.value.min_offset, e.value.max_offset) == (0, 10)
    assert h.store.queue_range("never-written", 0) == (0, 0)
    empty = h.store.read_queue("never-written", 0, 0, 32, 1 << 20)
    assert (empty.count, empty.next_offset) == (0, 0)


def test_reopen_after_clean_close_keeps_every_record_and_continues_numbering(harness):
    h = harness.open()
    first = [append(h, T, q, 40) for q in (0, 1)]
    h.close()
    h = harness.open()
    assert h.report.clean, "a clean close must be reported as clean"
    assert h.store.queues() == {T: [0, 1]}
    for q in (0, 1):
        assert h.store.queue_range(T, q) == (0, 40)
        for i, msg in enumerate(read_all(h.store, T, q, 0, 40)):
            check_message(msg, T, q, i)
            assert msg.position == first[q].positions[i]
    more = append(h, T, 0, 5)
    assert more.first_queue_offset == 40
    assert min(more.positions) > max(first[1].positions), "positions must never be reused"


def test_index_serves_the_entries_the_store_wrote(harness):
    h = harness.open()
    res = append(h, T, 0, 12)
    if hasattr(h.store, "flush"):
        h.store.flush()
    h.index.flush()
    raw = bytes(h.index.read(T, 0, 2, 5))
    assert len(raw) == 5 * record.INDEX_ENTRY_SIZE
    for i in range(5):
        pos, size, th = record.INDEX_ENTRY.unpack_from(raw, i * record.INDEX_ENTRY_SIZE)
        assert pos == res.positions[2 + i]
        assert th == record.tag_hash(["a", "b", None][(2 + i) % 3])
        assert size == record.record_size(h.store.read_position(pos))
    assert h.index.queue_range(T, 0) == (0, 12)
    assert h.index.queues() == {T: [0]}


def test_recovery_report_counts_records_not_bytes(harness):
    h = harness.open()
    append(h, T, 0, 30)
    append(h, T, 1, 12)
    h.close()
    h = harness.open()
    assert h.report.clean
    assert h.report.records in (0, 42), "records is the number of records found (0 if not counted)"
