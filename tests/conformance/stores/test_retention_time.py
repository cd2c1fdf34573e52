"""Retention (delete_before) and lookup by time."""

from __future__ import annotations

import time

import pytest

from equeue_core.errors import OffsetOutOfRangeError

from .kit import append, check_message, read_all, verified_messages

T = "orders"


def _fill(h, batches=5, per=50):
    return [append(h, T, 0, per) for _ in range(batches)] + [append(h, "other", 1, per) for _ in range(2)]


def _check_after_retention(h, cut_offset: int, hi: int) -> int:
    lo, top = h.store.queue_range(T, 0)
    assert top == hi
    assert lo <= cut_offset, "retention dropped records at or above the cut position"
    for i, msg in enumerate(read_all(h.store, T, 0, lo, hi)):
        check_message(msg, T, 0, lo + i)
    if lo > 0:
        for below in (0, lo - 1):
            with pytest.raises(OffsetOutOfRangeError) as e:
                h.store.read_queue(T, 0, below, 10, 1 << 20)
            assert (e.value.min_offset, e.value.max_offset) == (lo, hi)
    return lo


def test_reads_below_the_retention_cut_raise_offset_out_of_range_with_min_offset(harness):
    h = harness.open()
    results = _fill(h)
    cut = results[2].positions[0]  # first record of the third batch: queue offset 100
    h.store.flush()
    h.store.delete_before(cut)
    _check_after_retention(h, 100, 250)
    # the other topic was written after the cut position: all of it stays
    lo, hi = h.store.queue_range("other", 1)
    assert hi == 100
    for i, msg in enumerate(read_all(h.store, "other", 1, lo, hi)):
        check_message(msg, "other", 1, lo + i)


def test_retention_cut_survives_reopen_and_appends_continue(harness):
    h = harness.open()
    results = _fill(h)
    h.store.delete_before(results[3].positions[0])
    lo = _check_after_retention(h, 150, 250)
    h.close()
    h = harness.open()
    assert _check_after_retention(h, 150, 250) == lo
    assert append(h, T, 0, 3).first_queue_offset == 250
    msgs = verified_messages(h.store.read_queue(T, 0, 248, 10, 1 << 20).records)
    assert [m.queue_offset for m in msgs] == [248, 249, 250, 251, 252]


def test_deleting_below_everything_keeps_the_max_offset(harness):
    h = harness.open()
    results = _fill(h, batches=2, per=10)
    h.store.delete_before(results[-1].end_position)
    lo, hi = h.store.queue_range(T, 0)
    assert hi == 20 and lo <= 20
    assert append(h, T, 0, 2).first_queue_offset == 20


def test_offset_for_timestamp_finds_the_first_record_stored_at_or_after(harness):
    h = harness.open()
    for _ in range(3):
        append(h, T, 0, 10)
        time.sleep(0.03)
    msgs = read_all(h.store, T, 0, 0, 30)
    ts = [m.store_ts for m in msgs]
    assert ts == sorted(ts)
    second = ts[10]
    assert ts[9] < second - 1, "the test slept between batches; store times must differ"
    assert h.store.offset_for_timestamp(T, 0, second) == 10
    assert h.store.offset_for_timestamp(T, 0, second - 1) == 10
    assert h.store.offset_for_timestamp(T, 0, ts[20]) == 20
    assert h.store.offset_for_timestamp(T, 0, 0) == 0
    assert h.store.offset_for_timestamp(T, 0, ts[-1] + 60_000) == 30
    assert h.store.offset_for_timestamp("never-written", 0, 0) == 0
