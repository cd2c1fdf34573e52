"""Rows/second read into Spark from each installed store, with a Parquet copy of the same rows as the peer.

    .venv/bin/python -m bench.bench_spark [--messages 1000000] [--body 100] [--queues 4]
        [--master local[2]] [--stores file,lmdb,rocksdb] [--dir /tmp/x]

For every store: N messages of `--body` bytes are appended over `--queues` queues through the store
plugin's own MessageStore (real files on disk), then a local SparkSession runs, timed after one
warm-up action: `count()` and a filter on the body (`count` of rows whose body contains a byte
string, so every body is read). `export_only` times the store reader's export() alone in this
process (the ceiling the Spark source can reach). The peer is the same rows in one Parquet file read
by the same session: same machine, same run. One JSON line per result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def write_store(store: str, data_dir: str, topic: str, n: int, body_size: int, queues: int) -> float:
    """Append n messages through the store's MessageStore; returns seconds taken."""
    from equeue_core import record
    from equeue_core.contracts import StoreSettings
    from equeue_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    settings = StoreSettings(data_dir=data_dir)
    index = pm.queue_index(store)(settings)
    ms = pm.message_store(store)(settings, index)
    ms.open()
    t = time.perf_counter()
    per_queue = n // queues
    chunk = 2000
    try:
        for q in range(queues):
            count = per_queue + (1 if q < n % queues else 0)
            for s in range(0, count, chunk):
                recs = []
                for i in range(s, min(count, s + chunk)):
                    head = b"%d:%d:" % (q, i)
                    recs.append(record.encode_record(topic, head + b"x" * max(0, body_size - len(head)),
                                                     queue_id=q))
                batch = bytearray(b"".join(recs))
                ms.append(topic, q, batch, record.scan(batch))
        ms.flush()
    finally:
        ms.close()
    return time.perf_counter() - t


def export_only(store: str, data_dir: str, topic: str) -> tuple[int, float]:
    from equeue_spark.common import open_store_reader

    r = open_store_reader(store, data_dir)
    try:
        t = time.perf_counter()
        rows = 0
        for q in r.queues()[topic]:
            lo, hi = r.queue_range(topic, q)
            for b in r.export(topic, q, lo, hi):
                rows += b.num_rows
        return rows, time.perf_counter() - t
    finally:
        r.close()


def timed(fn) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", "-n", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--stores", default=None, help="comma-separated (default: every installed store)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    args = ap.parse_args(argv)

    from equeue_spark.session import get_session
    from pyspark.sql import functions as F

    from equeue_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    installed = sorted(set(pm.names("equeue_store_readers")) & set(pm.names("equeue_message_stores")))
    stores = args.stores.split(",") if args.stores else installed
    work = args.dir or tempfile.mkdtemp(prefix="bench_spark_")
    topic = "bench"
    n = args.messages
    spark = get_session(args.master, app_name="bench-spark")
    common = {"bench": "spark_read", "messages": n, "body_bytes": args.body, "queues": args.queues,
              "master": args.master, "cpus": os.cpu_count()}
    try:
        parquet_path = None
        for store in stores:
            data = os.path.join(work, store)
            shutil.rmtree(data, ignore_errors=True)
            os.makedirs(data)
            secs = write_store(store, data, topic, n, args.body, args.queues)
            _emit(**common, store=store, op="append_via_store", seconds=round(secs, 3),
                  rows_per_s=round(n / secs))
            rows, secs = export_only(store, data, topic)
            assert rows == n, (rows, n)
            _emit(**common, store=store, op="export_only", seconds=round(secs, 3), rows_per_s=round(n / secs))

            df = (spark.read.format("equeue").option("store", store).option("path", data)
                  .option("topic", topic).load())
            # warm-up (workers started, plugins imported) on a one-row-per-queue read
            (spark.read.format("equeue").option("store", store).option("path", data)
             .option("topic", topic).option("endingOffset", "1").load().collect())
            count, secs = timed(df.count)
            assert count == n, (count, n)
            _emit(**common, store=store, op="count", seconds=round(secs, 3), rows_per_s=round(n / secs))
            hits, secs = timed(lambda df=df: df.where(F.instr(F.col("body").cast("string"), ":7:") > 0).count())
            _emit(**common, store=store, op="filter_body", hits=hits, seconds=round(secs, 3),
                  rows_per_s=round(n / secs))
            if parquet_path is None:
                parquet_path = os.path.join(work, "peer.parquet")
                df.write.mode("overwrite").parquet(parquet_path)
        if parquet_path:
            pdf = spark.read.parquet(parquet_path)
            pdf.limit(1).collect()
            _, secs = timed(lambda: pdf.select("body").where(F.length("body") > 0).count())
            _emit(**common, store="parquet_peer", op="count_scan", seconds=round(secs, 3), rows_per_s=round(n / secs))
            hits, secs = timed(lambda: pdf.where(F.instr(F.col("body").cast("string"), ":7:") > 0).count())
            _emit(**common, store="parquet_peer", op="filter_body", hits=hits, seconds=round(secs, 3),
                  rows_per_s=round(n / secs))
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
