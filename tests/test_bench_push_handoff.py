"""bench/bench_push_handoff.py at a tiny size: both consumer models end to end (its own broker,
sender process and consumer), every figure of a row, and the slow-message periods from exact
inputs. Nothing here asserts a time."""

from __future__ import annotations

from bench.bench_push_handoff import slow_messages
from tests.helpers.bench_rows import bench_rows

MS = 1_000_000


def test_both_models_give_every_figure():
    rows = bench_rows("bench.bench_push_handoff", "--threads", "2", "--models", "loop,pulling", "--count", "400",
                      "--rate", "1000")
    assert [row["model"] for row in rows] == ["loop", "pulling"]
    for row in rows:
        assert row["count"] == 400 and row["end_to_end"]["count"] == 400, row
        slow = row["slow"]
        assert 0 <= slow["largest_episode"] <= slow["over_1ms"] <= 400 and slow["slow_episodes"] <= slow["over_1ms"]
        assert row["consumer_loop"]["stalls_over_2ms"] >= 0 and row["consumer_gc"]["collections"] >= 0
        # the loop thread ran (heartbeats, pulls) and is part of the process
        assert 0 < row["consumer_loop_thread_cpu_us_per_msg"] <= row["consumer_cpu_us_per_msg"], row
        sender = row["sender"]
        assert 0 <= sender["send_p50_ms"] <= sender["send_p99_ms"] <= sender["send_max_ms"], sender
        assert sender["late_max_ms"] >= sender["late_p99_ms"] >= 0 and 0 <= sender["sends_over_2ms"] <= 400
    loop = rows[0]
    assert loop["sent_to_submit"]["count"] == loop["submit_to_handler"]["count"] == 400


def test_slow_messages_give_the_period_of_recurring_episodes():
    """Three stalls a second apart, each making 6 messages late, and two late on their own: 20
    slow messages in 5 episodes, the stalls' period 1000 ms (lone slow messages are no episode
    of 5 and do not count for it)."""
    seen = []
    for start in (0, 1000 * MS, 2000 * MS):
        seen += [(start + i * MS // 2, start + i * MS // 2 + 3 * MS, 0, 0) for i in range(6)]
    seen += [(500 * MS, 502 * MS, 0, 0), (1500 * MS, 1502 * MS, 0, 0)]
    seen += [(t * MS, t * MS + MS // 5, 0, 0) for t in range(3000, 3100)]  # on time
    assert slow_messages(seen) == {"over_1ms": 20, "slow_episodes": 5, "largest_episode": 6,
                                   "episode_period_ms": 1000.0}
    assert slow_messages(seen[:6])["episode_period_ms"] is None  # one stall: no period
