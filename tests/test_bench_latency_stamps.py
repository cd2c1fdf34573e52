"""The latency stamps of the peers benchmark (bench/peers/common.py): each message carries the
time its sender made it and the time its pace meant it to go, so a stall that held a waiting
sender back is counted from the slot although the stamp taken after it hides it."""

from __future__ import annotations

import time

from bench.peers.common import STAMP_BYTES, Latencies, Pace, paced, stamp, warmup_body


def test_a_message_sent_late_counts_its_wait_from_the_slot_not_from_its_stamp():
    lat = Latencies()
    slot = time.time_ns() - 5_000_000  # its slot was 5 ms ago: the sender was held up that long
    assert lat.add(stamp(100, slot))
    assert len(lat) == 1
    assert lat.sent[0] < 5.0 <= lat.due[0]


def test_without_a_slot_both_latencies_are_from_the_stamp():
    lat = Latencies()
    body = stamp(100)
    assert len(body) == 100 and STAMP_BYTES <= 100
    lat.add(body)
    assert abs(lat.due[0] - lat.sent[0]) < 0.001


def test_warm_up_bodies_are_not_counted():
    lat = Latencies()
    assert not lat.add(warmup_body(100))
    assert len(lat) == 0 and lat.summary()["count"] == 0


def test_the_summary_gives_each_percentile_from_the_stamp_and_from_the_slot():
    lat = Latencies()
    now = time.time_ns()
    for late_ms in (0, 0, 0, 10):
        lat.add(stamp(100, now - late_ms * 1_000_000))
    row = lat.summary()
    assert row["count"] == 4
    assert row["max_ms"] < 10 <= row["due_max_ms"]
    assert set(row) >= {"p50_ms", "p99_ms", "due_p50_ms", "due_p99_ms", "due_max_ms"}


def test_paced_hands_each_send_its_slot_and_never_sends_before_it():
    slots: list[tuple[int, int, int]] = []
    paced(5, 1000.0, False, lambda i, due: slots.append((i, due, time.time_ns())))
    paced(5, 1000.0, True, lambda i, due: slots.append((i, due, time.time_ns())))
    assert [i for i, _, _ in slots] == [0, 1, 2, 3, 4] * 2
    for (_, a, _), (_, b, _) in zip(slots[:4], slots[1:5], strict=True):
        assert b - a == 1_000_000  # 1000/s: a slot every ms
    # sleeping and spinning alike: each send at or after its slot, on the clock the stamps use
    assert all(sent >= due for _, due, sent in slots)


def test_a_slot_is_due_a_period_after_the_one_before():
    pace = Pace(2000.0)
    assert pace.due_ns(4) - pace.start_ns == 2_000_000
    assert pace.wait(0, spin=False) == pace.start_ns
