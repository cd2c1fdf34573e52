"""Reading a topic while a real broker is receiving it: every row is intact, offsets are a prefix."""

from __future__ import annotations

import threading
import time

from pyspark.sql import functions as F
from spark_helpers import check_body, make_body

from equeue_core.client import Message, Producer
from tests.helpers.broker import start_broker


def test_read_while_a_producer_sends(spark, store_name, tmp_path):
    with start_broker(tmp_path, store=store_name) as broker:
        stop = threading.Event()
        sent = [0]
        errors: list[BaseException] = []

        def produce() -> None:
            try:
                with Producer(broker=broker.address) as p:
                    i = 0
                    while not stop.is_set() and i < 30_000:
                        p.send_batch([Message("live", make_body(0, i + j, "live")) for j in range(200)])
                        i += 200
                        sent[0] = i
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        try:
            while sent[0] < 2000 and t.is_alive():
                stop.wait(0.05)
            reads = []
            for _ in range(3):  # several reads race the producer
                df = (spark.read.format("equeue").option("path", str(broker.data_dir))
                      .option("topic", "live").option("maxOffsetsPerPartition", "3000").load())
                rows = df.select("queue_id", "queue_offset", "body").collect()
                reads.append(len(rows))
                assert all(check_body(bytes(r.body)) for r in rows), "a torn or corrupt body was read"
                per_queue: dict[int, list[int]] = {}
                for r in rows:
                    per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
                for offs in per_queue.values():  # a consistent prefix: no holes
                    offs.sort()
                    assert offs == list(range(offs[0], offs[0] + len(offs)))
                assert df.where(F.length("body") < 8).count() == 0
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors
        assert reads[0] >= 2000 and reads[-1] >= reads[0]
        assert sent[0] >= reads[-1]


def test_stream_while_a_producer_sends_gets_every_message_once(spark, store_name, tmp_path):
    total = 12_000
    with start_broker(tmp_path, store=store_name) as broker:
        with Producer(broker=broker.address) as p:  # the topic exists before the query starts
            p.send_batch([Message("flow", make_body(9, i, "flow")) for i in range(200)])
        out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
        q = (spark.readStream.format("equeue").option("path", str(broker.data_dir)).option("topic", "flow")
             .option("maxMessagesPerTrigger", "3000").load()
             .select("queue_id", "queue_offset", "body").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", ck).trigger(processingTime="500 milliseconds")
             .start())
        try:
            with Producer(broker=broker.address) as p:
                for s in range(200, total, 400):
                    p.send_batch([Message("flow", make_body(9, i, "flow")) for i in range(s, min(total, s + 400))])
            deadline = time.monotonic() + 120
            seen = 0
            while time.monotonic() < deadline:
                q.processAllAvailable()
                seen = sum(p["numInputRows"] for p in q.recentProgress)
                if seen >= total:
                    break
            assert q.exception() is None
        finally:
            q.stop()
    rows = spark.read.parquet(out).collect()
    assert len(rows) == total  # exactly once into the sink: no duplicates
    assert sorted(bytes(r.body) for r in rows) == sorted(make_body(9, i, "flow") for i in range(total))
