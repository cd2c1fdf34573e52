"""The latency stamps of the peers benchmark (bench/peers/common.py): each message carries the
time its sender made it and the time its pace meant it to go, so a stall that held a waiting
sender back is counted from the slot although the stamp taken after it hides it."""

from __future__ import annotations

import struct
import time

from bench.peers.common import (
    EPISODE_GAP_MS,
    SLOW_MS,
    STAMP_BYTES,
    Latencies,
    Pace,
    episodes,
    paced,
    stamp,
    warmup_body,
)


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


def test_episodes_are_runs_of_stamps_close_to_the_one_before():
    ms = 1_000_000
    assert episodes([]) == []
    assert episodes([7]) == [(7, 1)]
    # out of order on purpose; exactly 5 ms apart is still one run, a nanosecond more is not
    stamps = [100 * ms, 0, 2 * ms, 7 * ms, 12 * ms + 1, 101 * ms, 500 * ms]
    assert episodes(stamps, gap_ms=5.0) == [(0, 3), (12 * ms + 1, 1), (100 * ms, 2), (500 * ms, 1)]
    assert [size for _, size in episodes(stamps, gap_ms=0.5)] == [1] * 7


def test_the_summary_counts_slow_messages_and_the_episodes_they_came_in():
    """Six messages late together (a stall) and one late on its own: 7 slow messages in 2
    episodes, the largest of 6; messages under SLOW_MS do not count."""
    lat = Latencies()
    now = time.time_ns()
    ms = 1_000_000
    late = 3 * ms
    stall = now - 200 * ms
    assert EPISODE_GAP_MS > 0.5  # so the stall's stamps, 0.5 ms apart, make one episode
    for i in range(6):  # stamped 0.5 ms apart, each received 3 ms later
        t = stall + i * ms // 2
        lat.add(_body(t), now=t + late)
    lone = now - 50 * ms
    lat.add(_body(lone), now=lone + late)
    for i in range(50):  # on time
        t = now - 100 * ms + i * ms
        lat.add(_body(t), now=t + int(SLOW_MS * ms) // 4)
    row = lat.summary()
    assert row["count"] == 57
    assert (row["over_1ms"], row["slow_episodes"], row["largest_episode"]) == (7, 2, 6)


def test_no_slow_message_no_episode():
    row = Latencies().summary()
    assert (row["over_1ms"], row["slow_episodes"], row["largest_episode"]) == (0, 0, 0)


def _body(sent_ns: int) -> bytes:
    """A latency body stamped at sent_ns (its slot the same)."""
    return struct.pack("<QQ", sent_ns, sent_ns) + b"\0" * (100 - STAMP_BYTES)


def test_the_receivers_cpu_is_counted_from_its_first_message_every_cpu_every_messages():
    lat = Latencies()
    now = time.time_ns()
    for _ in range(Latencies.CPU_EVERY):
        lat.add(_body(now), now=now + 1000)
    assert lat.summary()["receiver_cpu_us_per_msg"] is None  # one read so far: no span yet
    for _ in range(Latencies.CPU_EVERY):
        sum(range(2000))  # a receiver that does some work a message
        lat.add(_body(now), now=now + 1000)
    assert lat.summary()["receiver_cpu_us_per_msg"] > 0


def test_paced_gives_the_sleeping_senders_cpu_and_none_for_a_spinning_one():
    def send(i: int, due: int) -> None:
        sum(range(20000))

    sleeping = paced(20, 2000.0, False, send)
    assert sleeping["count"] == 20 and sleeping["msgs_per_s"] > 0
    assert sleeping["sender_cpu_us_per_msg"] > 0
    assert paced(5, 2000.0, True, send)["sender_cpu_us_per_msg"] is None


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
