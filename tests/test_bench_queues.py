"""bench/bench_queues.py at a tiny size: one case end to end (its own broker, producer and consumer
processes), one JSON row with every figure, and `--connections 0` skipping the connection-memory
figure instead of dividing by zero. Nothing here asserts a time."""

from __future__ import annotations

from tests.helpers.bench_rows import bench_rows


def test_one_small_case_without_the_connection_figure():
    rows = bench_rows("bench.bench_queues", "--count", "2000", "--cases", "4", "--connections", "0", "--sync-seconds", "0",
                      "--paced-seconds", "0")
    assert [row["bench"] for row in rows] == ["queues"]
    row = rows[0]
    assert row["case"] == "1 topic x 4 queues" and row["queues"] == 4
    assert row["consumed"] >= 2000
    for key in ("produce_msgs_per_s", "consume_msgs_per_s", "consume_lite_msgs_per_s"):
        assert row[key] > 0, (key, row)
    assert all(v >= 0 for v in row["cpu_us_per_msg"].values()), row
    # each process's time by thread: the producer's caller sent, the consumer's loop thread
    # pulled and its handler threads ran the handler
    assert row["producer_threads_ms"]["cpu"]["caller"] > 0, row
    assert row["consumer_threads_ms"]["cpu"]["loop"] > 0, row
    assert row["consumer_threads_ms"]["cpu"]["handlers"] > 0, row


def test_the_paced_many_topic_case_alone():
    """`--cases none` runs no queue-count case; the paced ones (queues written first, and
    queues only created) give latency percentiles from their samples and the CPU of both ends,
    for the messages they sent at the pace asked."""
    rows = bench_rows("bench.bench_queues", "--cases", "none", "--connections", "0", "--sync-seconds", "0", "--paced-seconds", "0.5",
                      "--paced-rate", "4000")
    assert [row["bench"] for row in rows] == ["queues_paced", "queues_paced_cold"]
    for row in rows:
        assert row["count"] == 2000 and row["topics"] == 100 and row["rate"] == 4000
        assert row["samples"] == len(range(0, 2000, 97))
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["cpu_us_per_msg"]["producer"] > 0 and row["cpu_us_per_msg"]["broker"] > 0
        assert row["create_topics_s"] > 0
