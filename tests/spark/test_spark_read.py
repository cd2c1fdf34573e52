"""Batch and streaming reads of real store data, for every installed store reader."""

from __future__ import annotations

import json
import os
import time

import pytest
from equeue_spark.common import EQueueSparkError, open_store_reader
from pyspark.sql import functions as F
from spark_helpers import StoreWriter, check_body, fill, make_body, read_df

TOPIC = "orders"
PER_QUEUE = 5000  # 4 queues -> 20k messages


def _rows(df) -> dict[tuple[int, int], bytes]:
    return {(r.queue_id, r.queue_offset): bytes(r.body)
            for r in df.select("queue_id", "queue_offset", "body").collect()}


def _expected(per_queue: dict[int, tuple[int, int]], salt: str = "") -> dict[tuple[int, int], bytes]:
    return {(q, i): make_body(q, i, salt) for q, (s, e) in per_queue.items() for i in range(s, e)}


def test_batch_read_returns_exactly_what_was_stored(spark, store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    fill(store_name, data, TOPIC, {q: (0, PER_QUEUE) for q in range(4)})

    df = read_df(spark, store_name, data, TOPIC, maxOffsetsPerPartition="2000")
    assert df.columns == ["topic", "queue_id", "queue_offset", "msg_id", "tag", "keys", "properties",
                          "body", "born_ts", "store_ts"]
    # 4 queues of 5000 offsets in partitions of at most 2000 -> 10, most of them across two queues
    assert df.rdd.getNumPartitions() == 10
    got = _rows(df)
    assert len(got) == 4 * PER_QUEUE
    assert got == _expected({q: (0, PER_QUEUE) for q in range(4)})

    one = df.where("queue_id = 2 and queue_offset = 7").collect()[0]
    assert one.topic == TOPIC and one.keys == ["k2"] and one.tag is None
    assert len(one.msg_id) == 28 and one.store_ts is not None and one.born_ts is not None
    assert df.select(F.countDistinct("msg_id")).first()[0] == 4 * PER_QUEUE


def test_batch_read_options_select_queues_offsets_and_times(spark, store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    w = StoreWriter(store_name, data)
    try:
        for q in range(3):
            w.append(TOPIC, q, [make_body(q, i) for i in range(100)])
        t_mid = int(time.time() * 1000) + 5
        time.sleep(0.05)
        for q in range(3):
            w.append(TOPIC, q, [make_body(q, i) for i in range(100, 150)])
    finally:
        w.close()

    counts = {r.queue_id: (r["count"], r["lo"], r["hi"]) for r in read_df(
        spark, store_name, data, TOPIC, queues="0,2", startingOffset='{"0": 10, "2": 140}',
        endingOffset="120").groupBy("queue_id").agg(
        F.count("*").alias("count"), F.min("queue_offset").alias("lo"), F.max("queue_offset").alias("hi")).collect()}
    # queue 2's start (140) is past the common end (120): an empty range, not an error
    assert counts == {0: (110, 10, 119)}

    by_time = read_df(spark, store_name, data, TOPIC, startingTimestamp=str(t_mid))
    got = by_time.groupBy("queue_id").agg(F.min("queue_offset").alias("lo"), F.count("*").alias("n")).collect()
    assert sorted((r.queue_id, r.lo, r.n) for r in got) == [(0, 100, 50), (1, 100, 50), (2, 100, 50)]
    before = read_df(spark, store_name, data, TOPIC, endingTimestamp=str(t_mid), queues="1")
    assert before.count() == 100


def test_streaming_available_now_resumes_from_checkpoint(spark, store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    fill(store_name, data, TOPIC, {q: (0, PER_QUEUE) for q in range(4)})
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")

    def run(**options: str):
        reader = (spark.readStream.format("equeue").option("store", store_name)
                  .option("path", data).option("topic", TOPIC))
        for k, v in options.items():
            reader = reader.option(k, v)
        q = (reader.load().select("queue_id", "queue_offset", "body").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", ck).trigger(availableNow=True).start())
        assert q.awaitTermination(180), "availableNow query did not finish"
        assert q.exception() is None
        return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]

    assert sum(run()) == 4 * PER_QUEUE
    assert _rows(spark.read.parquet(out)) == _expected({q: (0, PER_QUEUE) for q in range(4)})

    # 5k more; the same query from its checkpoint reads exactly those, in several capped batches
    fill(store_name, data, TOPIC, {q: (PER_QUEUE, PER_QUEUE + 1250) for q in range(4)})
    batches = run(maxMessagesPerTrigger="1500")
    assert sum(batches) == 5000
    assert len(batches) >= 4 and max(batches) <= 1500
    final = spark.read.parquet(out)
    assert final.count() == 25_000  # no duplicates
    assert _rows(final) == _expected({q: (0, PER_QUEUE + 1250) for q in range(4)})  # no gaps

    # the checkpoint's offsets are {queue: next offset}
    offsets_dir = os.path.join(ck, "offsets")
    last = max(os.listdir(offsets_dir), key=lambda n: int(n) if n.isdigit() else -1)
    with open(os.path.join(offsets_dir, last)) as f:
        offset = json.loads(f.read().strip().splitlines()[-1])
    assert offset == {str(q): PER_QUEUE + 1250 for q in range(4)}


def test_streaming_starting_offsets_latest_and_json(spark, store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    fill(store_name, data, TOPIC, {0: (0, 30), 1: (0, 30)})
    for starting, expected in (("latest", 0), ('{"0": 25}', 5 + 30)):
        q = (spark.readStream.format("equeue").option("store", store_name).option("path", data)
             .option("topic", TOPIC).option("startingOffsets", starting).load()
             .writeStream.format("memory").queryName(f"s_{store_name}_{expected}")
             .trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert spark.table(f"s_{store_name}_{expected}").count() == expected


def test_unknown_store_and_missing_topic_are_clear_errors(spark, store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    fill(store_name, data, TOPIC, {0: (0, 3)})
    with pytest.raises(EQueueSparkError, match="nosuchstore.*installed"):
        open_store_reader("nosuchstore", data)
    with pytest.raises(Exception, match="topic 'missing' is not in the store"):
        read_df(spark, store_name, data, "missing").count()
    with pytest.raises(Exception, match="nosuchstore"):
        read_df(spark, "nosuchstore", data, TOPIC).count()


def test_reader_while_the_writer_holds_the_store(spark, store_name, tmp_path):
    """Either the engine allows a second process to read while the store is open for writing
    (and the read sees everything flushed), or the failure names the store."""
    data = str(tmp_path / "data")
    os.makedirs(data)
    w = StoreWriter(store_name, data)
    try:
        w.append(TOPIC, 0, [make_body(0, i) for i in range(500)])
        try:
            rows = read_df(spark, store_name, data, TOPIC).select("body").collect()
        except Exception as e:  # noqa: BLE001 - the message is what is under test
            assert f"store {store_name!r} cannot be read" in str(e)
        else:
            assert len(rows) == 500 and all(check_body(bytes(r.body)) for r in rows)
    finally:
        w.close()


def test_auto_registration_module_points_at_the_source():
    """PySpark auto-registers `pyspark_*` modules' DefaultSource under DefaultSource.name()."""
    from equeue_spark.datasource import EQueueDataSource

    import pyspark_equeue

    assert pyspark_equeue.DefaultSource is EQueueDataSource and EQueueDataSource.name() == "equeue"


def test_a_plugin_that_fails_to_import_does_not_stop_reads(store_name, tmp_path):
    """A real (broken) third-party plugin installed next to ours: reads still open the store, and
    the broken plugin is reported, not silently ignored."""
    import subprocess
    import sys
    import textwrap

    data = str(tmp_path / "data")
    os.makedirs(data)
    fill(store_name, data, TOPIC, {0: (0, 5)})
    site = tmp_path / "site"
    dist = site / "broken_equeue_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-equeue-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[equeue]\nbroken = no_such_module_for_equeue_tests\n")
    code = textwrap.dedent(f"""
        from equeue_spark.common import open_store_reader
        r = open_store_reader({store_name!r}, {data!r})
        print(r.queue_range({TOPIC!r}, 0))
        r.close()
    """)
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "(0, 5)" in out.stdout
    assert "broken" in out.stderr and "no_such_module_for_equeue_tests" in out.stderr
