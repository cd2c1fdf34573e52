"""DataFrame -> topic through a real broker process; a real Consumer receives every row."""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql import functions as F

from equeue_core.client import Consumer
from equeue_core.plugins import get_plugin_manager
from tests.helpers.broker import start_broker

N = 10_000


def _consume_all(address: str, topic: str, expected: int, timeout: float = 120.0) -> dict[bytes, object]:
    got: dict[bytes, object] = {}
    lock = threading.Lock()
    done = threading.Event()

    def handler(m) -> None:
        with lock:
            got[bytes(m.body)] = m
            if len(got) >= expected:
                done.set()

    consumer = Consumer("spark-test", broker=address, consume_from="first")
    consumer.subscribe(topic)
    consumer.start(handler)
    try:
        deadline = time.monotonic() + timeout
        while not done.wait(0.5) and time.monotonic() < deadline:
            pass
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("transport", get_plugin_manager().names("equeue_transports"))
def test_batch_write_reaches_a_consumer(spark, tmp_path, transport):
    with start_broker(tmp_path, transport=transport) as broker:
        df = (spark.range(N).repartition(2)
              .select(F.format_string("row-%06d", "id").cast("binary").alias("body"),
                      F.when(F.col("id") % 2 == 0, F.lit("even")).otherwise(F.lit("odd")).alias("tag"),
                      F.array(F.format_string("key-%d", "id")).alias("keys")))
        writer = df.write.format("equeue").option("broker", broker.address).option("topic", "written")
        if transport == "tls":  # the workers run in Spark's daemon: TLS files travel as options
            from tests.helpers.certs import session_certs

            writer = writer.option("tlsCa", str(session_certs().ca))
        writer.mode("append").save()
        got = _consume_all(broker.address, "written", N)
        assert sorted(got) == [b"row-%06d" % i for i in range(N)]
        m = got[b"row-000007"]
        assert m.tag == "odd" and list(m.keys) == ["key-7"]


def test_streaming_write_with_routing_keys_keeps_per_key_order(spark, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = [(f"k{i % 5}", f"{i % 5}:{i:05d}") for i in range(1000)]
    spark.createDataFrame(rows, "routing_key string, body string").coalesce(1).write.json(str(src / "in"))
    with start_broker(tmp_path, name="broker") as broker:
        q = (spark.readStream.schema("routing_key string, body string").json(str(src / "in"))
             .writeStream.format("equeue").option("broker", broker.address).option("topic", "keyed")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        assert q.awaitTermination(120)
        assert q.exception() is None
        got = _consume_all(broker.address, "keyed", 1000)
        assert len(got) == 1000
        # one key -> one queue, in send order
        for k in range(5):
            msgs = sorted((m for b, m in got.items() if b.startswith(b"%d:" % k)), key=lambda m: m.queue_offset)
            assert len({m.queue_id for m in msgs}) == 1
            assert [bytes(m.body) for m in msgs] == sorted(bytes(m.body) for m in msgs)
