"""Rows/second read into Spark from each installed store, with a Parquet copy of the same rows as the peer.

    .venv/bin/python -m bench.bench_spark [--messages 1000000] [--body 100] [--queues 4]
        [--master local[2]] [--stores file,lmdb,rocksdb] [--write 200000] [--dir /tmp/x]

For every store: N messages of `--body` bytes are appended over `--queues` queues through the store
plugin's own MessageStore (real files on disk), then a local SparkSession runs, timed after one
warm-up action: `count()` and a filter on the body (`count` of rows whose body contains a byte
string, so every body is read). `export_only` times the store reader's export() alone in this
process (the ceiling the Spark source can reach). The peer is the same rows in one Parquet file read
by the same session: same machine, same run. `--write N` also times df.write.format("equeue") of N
rows into a real broker process (file store) next to one plain Producer (send_batch) sending the
same rows. One JSON line per result.
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
    """Append n messages through the store engine's MessageStore; returns seconds taken."""
    from equeue_core import record
    from equeue_core.contracts import StoreSettings
    from equeue_core.plugins import get_plugin_manager

    engine = get_plugin_manager().store_engine(store)(StoreSettings(data_dir=data_dir))
    ms = engine.messages
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
        engine.close()
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


def write_bench(spark: Any, work: str, n: int, body_size: int, common: dict[str, Any]) -> None:
    """Rows/s of df.write.format("equeue") into a real broker process, next to one plain Producer
    sending the same rows with send_batch from this process (the peer)."""
    import socket
    import subprocess

    from pyspark.sql import functions as F

    from equeue_core.client import Message, Producer

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    data = os.path.join(work, "broker")
    os.makedirs(data, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "equeue_core.cli.main", "broker", "--data-dir", data,
                             "--host", "127.0.0.1", "--port", str(port), "--store", "file"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or b"listening on" in line:
                break
        address = f"127.0.0.1:{port}"
        df = spark.range(n).select(F.concat(F.lit("w"), F.lpad(F.col("id").cast("string"), body_size - 1, "x"))
                                   .cast("binary").alias("body")).cache()
        df.count()
        df.limit(10).write.format("equeue").option("broker", address).option("topic", "warm").mode("append").save()
        _, secs = timed(lambda: df.write.format("equeue").option("broker", address).option("topic", "w")
                        .mode("append").save())
        _emit(**common, store="file", op="spark_write", seconds=round(secs, 3), rows_per_s=round(n / secs))
        bodies = [b"w" + str(i).rjust(body_size - 1, "x").encode() for i in range(n)]

        def plain() -> None:
            with Producer(broker=address) as p:
                for s in range(0, n, 512):
                    p.send_batch([Message("p", b) for b in bodies[s:s + 512]])

        _, secs = timed(plain)
        _emit(**common, store="file", op="producer_send_batch_peer", seconds=round(secs, 3), rows_per_s=round(n / secs))
        df.unpersist()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


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
    ap.add_argument("--write", type=int, default=0, help="also time writing this many rows to a broker")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    args = ap.parse_args(argv)

    from equeue_spark.session import get_session
    from pyspark.sql import functions as F

    from equeue_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    installed = sorted(set(pm.names("equeue_store_readers")) & set(pm.names("equeue_store_engines")))
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
        if args.write:
            write_bench(spark, work, args.write, args.body, {**common, "bench": "spark_write", "messages": args.write})
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
