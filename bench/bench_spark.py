"""Rows/second read into Spark from each installed store, with a Parquet copy of the same rows as the peer.

    .venv/bin/python -m bench.bench_spark [--messages 1000000] [--body 100] [--queues 4]
        [--master local[2]] [--stores file,lmdb,rocksdb] [--write 200000] [--dir /tmp/x] [--repeat 3]

For every store: N messages of `--body` bytes (tags cycling a, b, c, d) are appended over
`--queues` queues through the store plugin's own MessageStore (real files on disk); `export_only`
times the store reader's export() alone in this process (the ceiling the Spark source can reach).
Then one local SparkSession (filter pushdown on) runs the same queries on the topic and on the
same rows in one Parquet file (the peer, written from that store's topic by that session: same
rows, same machine, same run):

- count_body: rows whose body is not empty (every body is read on both sides);
- filter_body: rows whose body contains a byte string (not pushable: the reader builds every row);
- filter_tag: `tag = 'b'` (pushed: rows dropped in the reader before the other columns are built);
- filter_offset: `queue_offset < N/queues/10` (pushed: partition and offset pruning);
- filter_time: `store_ts >=` the time of the last ~10 % (pushed: offset_for_timestamp per queue);
- count_columns: a count over two columns (`columns` option; Parquet: the same two columns).

Each query loads a fresh DataFrame (pyspark 4.3 reuses a DataFrame's last pushed plan, see
docs/spark.md) and is timed best of `--repeat`, alternating Parquet and topic runs so both see the
same machine load, after one warm-up read. One JSON line per result;
the equeue lines carry `ratio_vs_parquet` (equeue rows/s over Parquet rows/s, same query) and
`cpu_ratio_vs_parquet` (Parquet CPU seconds over equeue CPU seconds, summed over the driver, the
JVM and the Python workers: the same ratio, far less moved by other jobs on a shared machine).
`--write N` also times df.write.format("equeue") of N rows into a real broker process (file store)
next to one plain Producer (send_batch) sending the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
                                                     tag="abcd"[i % 4], queue_id=q))
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


def tree_cpu_seconds() -> float | None:
    """CPU seconds used so far by this process and all its descendants (Spark's JVM and Python
    workers), reaped children included; None where /proc is not there. On a machine shared with
    other jobs this moves far less with their load than wall time does."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        used[int(name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    me = os.getpid()
    total = 0
    for pid in used:
        p = pid
        while p and p != me and p in parent:
            p = parent[p]
        if p == me:
            total += used[pid]
    return total / tick


def timed_cpu(fn) -> tuple[Any, float, float | None]:
    """(result, wall seconds, CPU seconds of the whole process tree)."""
    c = tree_cpu_seconds()
    out, secs = timed(fn)
    c2 = tree_cpu_seconds()
    return out, secs, (c2 - c) if c is not None and c2 is not None else None


def read_queries(n: int, queues: int, ts_cut: int) -> dict[str, Any]:
    """name -> (DataFrame -> row count); the same query runs on the topic and on the Parquet copy."""
    from pyspark.sql import functions as F

    offset_cut = max(1, n // queues // 10)
    return {
        "count_body": lambda df: df.where(F.length("body") > 0).count(),
        "filter_body": lambda df: df.where(F.instr(F.col("body").cast("string"), ":7:") > 0).count(),
        "filter_tag": lambda df: df.where("tag = 'b'").count(),
        "filter_offset": lambda df: df.where(F.col("queue_offset") < offset_cut).count(),
        "filter_time": lambda df: df.where(F.col("store_ts") >= F.timestamp_millis(F.lit(ts_cut))).count(),
        "count_columns": lambda df: df.select("queue_id", "queue_offset").where(F.col("queue_offset") >= 0).count(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", "-n", type=int, default=1_000_000)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--stores", default=None, help="comma-separated (default: every installed store)")
    ap.add_argument("--write", type=int, default=0, help="also time writing this many rows to a broker")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed after)")
    ap.add_argument("--repeat", type=int, default=3, help="time each query best of this many runs")
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
    # filter pushdown on (docs/spark.md); set through the conf so this also runs against older trees
    spark = get_session(args.master, app_name="bench-spark",
                        extra_conf={"spark.sql.python.filterPushdown.enabled": "true"})
    common = {"bench": "spark_read", "messages": n, "body_bytes": args.body, "queues": args.queues,
              "master": args.master, "cpus": os.cpu_count()}
    try:
        parquet_path = os.path.join(work, "peer.parquet")
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

            def load(store: str = store, data: str = data, **options: str) -> Any:
                r = spark.read.format("equeue").option("store", store).option("path", data).option("topic", topic)
                for k, v in options.items():
                    r = r.option(k, v)
                return r.load()

            # warm-up (workers started, plugins imported) on a one-row-per-queue read
            load(endingOffset="1").collect()
            # the peer: this store's rows in one Parquet file (each store's rows have their own store times)
            load().write.mode("overwrite").parquet(parquet_path)
            stats = spark.read.parquet(parquet_path).agg(F.min("store_ts").alias("lo"),
                                                         F.max("store_ts").alias("hi")).first()
            lo_ms, hi_ms = (int(stats.lo.timestamp() * 1000), int(stats.hi.timestamp() * 1000))
            queries = read_queries(n, args.queues, hi_ms - (hi_ms - lo_ms) // 10)
            spark.read.parquet(parquet_path).where(F.length("body") > 0).count()  # warm-up
            for name, query in queries.items():
                narrow = name == "count_columns"

                def on_parquet(q: Any = query, narrow: bool = narrow) -> int:
                    pdf = spark.read.parquet(parquet_path)
                    return q(pdf.select("queue_id", "queue_offset") if narrow else pdf)

                def on_topic(q: Any = query, narrow: bool = narrow, load: Any = load) -> int:
                    return q(load(columns="queue_id,queue_offset") if narrow else load())

                best = {"p": float("inf"), "t": float("inf")}
                cpus: dict[str, list[float]] = {"p": [], "t": []}
                for _ in range(max(1, args.repeat)):  # alternate, so both see the same machine load
                    hits_p, secs, cpu = timed_cpu(on_parquet)
                    best["p"] = min(best["p"], secs)
                    cpus["p"].append(cpu or 0.0)
                    hits_t, secs, cpu = timed_cpu(on_topic)
                    best["t"] = min(best["t"], secs)
                    cpus["t"].append(cpu or 0.0)
                    assert hits_t == hits_p, (name, hits_t, hits_p)
                # CPU: the median (a worker that exits unreaped mid-run takes its CPU time along)
                cpu_p, cpu_t = statistics.median(cpus["p"]), statistics.median(cpus["t"])
                _emit(**common, store="parquet_peer", op=name, hits=hits_p, seconds=round(best["p"], 3),
                      rows_per_s=round(n / best["p"]), cpu_seconds=round(cpu_p, 2))
                _emit(**common, store=store, op=name, hits=hits_t, seconds=round(best["t"], 3),
                      rows_per_s=round(n / best["t"]), ratio_vs_parquet=round(best["p"] / best["t"], 3),
                      cpu_seconds=round(cpu_t, 2),
                      cpu_ratio_vs_parquet=round(cpu_p / cpu_t, 3) if cpu_t > 0 else None)
        if args.write:
            write_bench(spark, work, args.write, args.body, {**common, "bench": "spark_write", "messages": args.write})
    finally:
        spark.stop()
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
