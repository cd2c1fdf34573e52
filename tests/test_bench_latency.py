"""bench/bench_latency.py at a tiny size: the end-to-end case with its own broker, sender and
receiver processes, both senders (`send` and `send_async`), one JSON row each with every figure.
(`make bench` runs it; its sender role once broke on a helper's new return type and nothing
noticed.) Nothing here asserts a time."""

from __future__ import annotations

from tests.helpers.bench_rows import bench_rows


def test_the_end_to_end_case_gives_every_figure_for_both_senders():
    rows = bench_rows("bench.bench_latency", "--only", "e2e", "--rate", "1000", "--seconds", "0.5", "--rounds", "1")
    assert [(row["bench"], row["mode"]) for row in rows] == [("e2e", "send"), ("e2e", "async")]
    for row in rows:
        assert row["sent"] == 500 and row["count"] == 500, row
        assert 0 < row["achieved_rate"] <= 1100, row
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"], row
        assert row["sender_cpu_us_per_msg"] > 0 and row["receiver_cpu_us_per_msg"] > 0, row
        assert row["broker_cpu_us_per_msg"] > 0, row
