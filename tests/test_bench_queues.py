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


def test_size_sets_the_messages_of_the_produce_and_consume_cases():
    rows = bench_rows("bench.bench_queues", "--count", "1000", "--cases", "4", "--size", "1024", "--connections", "0",
                      "--sync-seconds", "0", "--paced-seconds", "0")
    row = rows[0]
    assert row["size"] == 1024 and row["consumed"] >= 1000 and row["produce_msgs_per_s"] > 0, row


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


def test_rounds_run_each_case_again_and_end_with_ratio_rows():
    """Each round's row of a case is its own drain, and the queues_ratio row compares each
    round with the 4-queue case of the same round."""
    rows = bench_rows("bench.bench_queues", "--count", "1000", "--cases", "4", "--rounds", "2", "--connections", "0",
                      "--sync-seconds", "0", "--paced-seconds", "0")
    assert [(row["bench"], row.get("round")) for row in rows] == [("queues", 0), ("queues", 1), ("queues_ratio", None)]
    assert [row["consumed"] for row in rows[:2]] == [1001, 1001]  # and the producer's routing send
    ratio = rows[2]
    assert ratio["rounds"] == 2 and ratio["consume_vs_4_queues"] == {"median": 1.0, "low": 1.0, "high": 1.0}


def test_ratio_rows_take_each_round_against_its_own_4_queue_case():
    from bench.bench_queues import ratio_rows

    def row(case: str, queues: int, r: int, rate: float, steady: float | None = None) -> dict:
        return {"case": case, "topics": 1, "queues": queues, "round": r, "produce_msgs_per_s": rate,
                "consume_msgs_per_s": rate, "consume_steady_msgs_per_s": steady, "consume_lite_msgs_per_s": rate}

    rows = [row("4", 4, 0, 100.0, 110.0), row("1000", 1000, 0, 80.0, 99.0), row("4", 4, 1, 200.0, None),
            row("1000", 1000, 1, 180.0, 190.0), row("4", 4, 2, 100.0, 100.0), row("1000", 1000, 2, 70.0, 50.0)]
    by_case = {r["case"]: r for r in ratio_rows(rows)}
    assert by_case["1000"]["consume_msgs_per_s"] == 80.0  # the median rate
    assert by_case["1000"]["consume_vs_4_queues"] == {"median": 0.8, "low": 0.7, "high": 0.9}
    # the steady rate (start left out): round 1's 4-queue drain ended before it held its queues,
    # so only rounds 0 and 2 compare
    assert by_case["1000"]["consume_steady_vs_4_queues"] == {"median": 0.7, "low": 0.5, "high": 0.9}
    assert by_case["1000"]["consume_steady_msgs_per_s"] == 99.0
    # without CPU times in the rows, no cost ratios
    assert by_case["1000"]["cpu_per_msg_vs_4_queues"]["consumer"] is None
    no_steady = ratio_rows([row("4", 4, 0, 100.0), row("1000", 1000, 0, 80.0)])
    assert no_steady[1]["consume_steady_vs_4_queues"] is None and no_steady[1]["consume_steady_msgs_per_s"] is None
    assert ratio_rows([row("1000", 1000, 0, 80.0)]) == []  # no 4-queue case: nothing to compare with


def test_ratio_rows_compare_each_process_cpu_a_message_with_its_rounds_4_queues():
    """The cost of a message, not only the rate: each role's CPU a message over the same round's
    4-queue case (>1: the case costs more), median, lowest and highest over the rounds."""
    from bench.bench_queues import COST_ROLES, ratio_rows

    def row(case: str, queues: int, r: int, consumer: float, broker: float) -> dict:
        cpu = dict.fromkeys(COST_ROLES, 1.0) | {"consumer": consumer, "broker_consume": broker}
        return {"case": case, "topics": 1, "queues": queues, "round": r, "produce_msgs_per_s": 1.0,
                "consume_msgs_per_s": 1.0, "consume_steady_msgs_per_s": None, "consume_lite_msgs_per_s": 1.0,
                "cpu_us_per_msg": cpu}

    rows = [row("4", 4, 0, 1.0, 0.3), row("1000", 1000, 0, 1.2, 0.6), row("4", 4, 1, 0.8, 0.2),
            row("1000", 1000, 1, 1.2, 0.3), row("1000", 1000, 2, 9.0, 9.0)]  # round 2: no 4-queue case
    costs = {r["case"]: r["cpu_per_msg_vs_4_queues"] for r in ratio_rows(rows)}
    assert costs["4"]["consumer"] == {"median": 1.0, "low": 1.0, "high": 1.0}
    assert costs["1000"]["consumer"] == {"median": 1.35, "low": 1.2, "high": 1.5}
    assert costs["1000"]["broker_consume"] == {"median": 1.75, "low": 1.5, "high": 2.0}
    assert costs["1000"]["producer"] == {"median": 1.0, "low": 1.0, "high": 1.0}
    zero = row("1000", 1000, 0, 0.0, 0.6)  # a process too short for the clock's ticks
    assert ratio_rows([row("4", 4, 0, 1.0, 0.3), zero])[1]["cpu_per_msg_vs_4_queues"]["consumer"] is None


def test_each_round_starts_one_case_further_on():
    """Over as many rounds as there are cases, every case runs once in every place of a round (a
    fixed order always ran the 4-queue case first, and a case's place in its round moved its
    rate), and a round keeps the cases' cyclic order."""
    from bench.bench_queues import CASES, round_cases

    rounds = [round_cases(CASES, r) for r in range(len(CASES))]
    for place in range(len(CASES)):
        assert sorted(r[place] for r in rounds) == sorted(CASES)
    for r in rounds:
        first = CASES.index(r[0])
        assert r == CASES[first:] + CASES[:first]
    assert round_cases(CASES, len(CASES)) == CASES
    assert round_cases([], 3) == []
