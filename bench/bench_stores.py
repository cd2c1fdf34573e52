"""Every installed message store side by side, one JSON line per result (docs/stores.md has a table).

    .venv/bin/python bench/bench_stores.py --records 1000000          # all stores, N = 1M
    .venv/bin/python bench/bench_stores.py --records 100000 --stores lmdb,rocksdb --table
    .venv/bin/python bench/bench_stores.py --summarize run1.jsonl run2.jsonl run3.jsonl  # medians

What is measured, per store, on real files under --dir (default: the system temp dir):
- fill: N records (100 B bodies, 4 queues, batches of 1000, async flush) appended by a child
  process, which then flushes and kills itself with SIGKILL; its append rate is `append` with
  record_bytes=100, batch=1000.
- recover_unclean: index + store factories + open() of that killed store (crash recovery).
- read_random: read_queue(max_count=1) at random (queue, offset) pairs.
- read_sequential: every record once, read_queue(max_count=32) (the broker's default pull size).
- disk: allocated bytes of the data dir per record, after a clean close (bodies are JSON-ish text
  with random numbers, so compression is neither flattered nor useless).
- reopen_clean: open() after a clean close.
- read_after_restart: then every record once, read_queue(max_count=1024) (the adaptive pull
  batch's ceiling): a consumer catching up on what a broker wrote before its restart. The file
  store checks every such record on read (docs/stores.md, "Every record served is verified").
- append: 1 KiB bodies in batches of 1000, and 100 B / 1 KiB bodies one record per append
  (async flush); append_sync: 1 KiB bodies, batches of 1000, sync flush, waiting for every batch.
Times are wall-clock on one machine in one run: compare stores with each other, not with numbers
taken elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from equeue_core import record
from equeue_core.contracts import StoreSettings
from equeue_core.plugins import get_plugin_manager

TOPIC = "bench"
QUEUES = 4
BATCH = 1000


WORDS = ("order", "customer", "amount", "status", "paid", "shipped", "EUR", "USD", "sku", "qty",
         "warehouse", "berlin", "lyon", "note", "priority", "express", "standard", "retry", "ok", "id")


def body(rng: random.Random, size: int) -> bytes:
    """A JSON-ish body of exactly size bytes: words and random numbers, so it compresses about as
    well as real event payloads do (a run of one byte would flatter compressing stores)."""
    parts = []
    n = 0
    while n < size:
        part = f'"{rng.choice(WORDS)}": {rng.randrange(10 ** rng.randrange(1, 9))}, '
        parts.append(part)
        n += len(part)
    return "".join(parts).encode()[:size]


def template(body_bytes: int, count: int) -> tuple[bytes, list[int]]:
    """A producer batch of count distinct records with bodies of body_bytes; stamped fresh per append."""
    rng = random.Random(body_bytes * 1_000_003 + count)
    buf = b"".join(record.encode_record(TOPIC, body(rng, body_bytes), tag=rng.choice(("a", "b", "c")),
                                        keys=(f"k{i}",)) for i in range(count))
    return buf, record.scan(buf)


def open_store(name: str, data_dir: str, flush: str = "async") -> tuple[Any, Any]:
    """(the store engine, its message store)."""
    settings = StoreSettings(data_dir=data_dir, flush=flush, flush_interval_ms=500)
    engine = get_plugin_manager().store_engine(name)(settings)
    return engine, engine.messages


def close(engine: Any, store: Any) -> None:
    engine.close()


def append_run(name: str, data_dir: str, body_bytes: int, batch: int, records: int,
               flush: str = "async") -> dict[str, Any]:
    """Append `records` records in batches of `batch`; returns the rate (the close is not timed)."""
    engine, store = open_store(name, data_dir, flush)
    buf, starts = template(body_bytes, batch)
    rounds = max(1, records // batch)
    t0 = time.perf_counter()
    for i in range(rounds):
        res = store.append(TOPIC, i % QUEUES, bytearray(buf), starts)
        if flush == "sync":
            store.wait_flushed(res.end_position).result(timeout=60)
    elapsed = time.perf_counter() - t0
    close(engine, store)
    n = rounds * batch
    return {"records": n, "seconds": round(elapsed, 4), "records_per_s": round(n / elapsed),
            "mb_per_s": round(n * len(buf) / batch / elapsed / 1e6, 2)}


def allocated_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def fill_and_die(name: str, data_dir: str, records: int) -> None:
    """Child process: fill, report the append rate, flush, then SIGKILL itself (no clean close)."""
    engine, store = open_store(name, data_dir)
    buf, starts = template(100, BATCH)
    t0 = time.perf_counter()
    for i in range(max(1, records // BATCH)):
        store.append(TOPIC, i % QUEUES, bytearray(buf), starts)
    elapsed = time.perf_counter() - t0
    store.flush()
    n = max(1, records // BATCH) * BATCH
    print(json.dumps({"records": n, "seconds": round(elapsed, 4), "records_per_s": round(n / elapsed),
                      "mb_per_s": round(n * len(buf) / BATCH / elapsed / 1e6, 2)}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def read_all(store: Any, max_count: int) -> tuple[int, float]:
    """Every record of every queue once, read_queue(max_count) at a time: (records, seconds)."""
    t0 = time.perf_counter()
    n = 0
    for q in range(QUEUES):
        offset, end = store.queue_range(TOPIC, q)
        while offset < end:
            res = store.read_queue(TOPIC, q, offset, max_count, 1 << 22)
            n += res.count
            offset = res.next_offset
    return n, time.perf_counter() - t0


def bench_store(name: str, root: str, records: int, random_reads: int, single: int, emit: Any) -> None:
    data_dir = os.path.join(root, name, "filled")
    os.makedirs(data_dir)
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--fill-child", name, data_dir,
                            str(records)], capture_output=True, timeout=3600)
    if child.returncode != -signal.SIGKILL:
        raise SystemExit(f"{name}: fill child failed ({child.returncode}): {child.stderr.decode()[-2000:]}")
    emit(name, "append", {"record_bytes": 100, "batch": BATCH, **json.loads(child.stdout.decode().splitlines()[-1])})

    t0 = time.perf_counter()
    engine, store = open_store(name, data_dir)
    emit(name, "recover_unclean", {"records": records, "seconds": round(time.perf_counter() - t0, 4)})

    per_queue = store.queue_range(TOPIC, 0)[1]
    rng = random.Random(7)
    picks = [(rng.randrange(QUEUES), rng.randrange(per_queue)) for _ in range(random_reads)]
    t0 = time.perf_counter()
    for q, o in picks:
        res = store.read_queue(TOPIC, q, o, 1, 1 << 20)
        assert res.count == 1
    elapsed = time.perf_counter() - t0
    emit(name, "read_random", {"reads": random_reads, "seconds": round(elapsed, 4),
                               "reads_per_s": round(random_reads / elapsed)})

    n, elapsed = read_all(store, 32)
    emit(name, "read_sequential", {"records": n, "seconds": round(elapsed, 4), "records_per_s": round(n / elapsed)})

    close(engine, store)
    on_disk = allocated_bytes(data_dir)
    emit(name, "disk", {"records": n, "bytes": on_disk, "bytes_per_record": round(on_disk / max(1, n), 1),
                        "record_bytes_stored": round(len(template(100, BATCH)[0]) / BATCH, 1)})

    t0 = time.perf_counter()
    engine, store = open_store(name, data_dir)
    emit(name, "reopen_clean", {"records": n, "seconds": round(time.perf_counter() - t0, 4)})
    n, elapsed = read_all(store, 1024)
    emit(name, "read_after_restart", {"records": n, "max_count": 1024, "seconds": round(elapsed, 4),
                                      "records_per_s": round(n / elapsed)})
    close(engine, store)
    shutil.rmtree(data_dir, ignore_errors=True)

    runs = [(1024, BATCH, records, "async", "append"), (100, 1, single, "async", "append"),
            (1024, 1, single, "async", "append"), (1024, BATCH, min(records, 200_000), "sync", "append_sync")]
    for i, (body, batch, count, flush, bench) in enumerate(runs):
        d = os.path.join(root, name, f"append{i}")
        os.makedirs(d)
        emit(name, bench, {"record_bytes": body, "batch": batch, "flush": flush,
                           **append_run(name, d, body, batch, count, flush)})
        shutil.rmtree(d, ignore_errors=True)


def markdown(results: list[dict[str, Any]]) -> str:
    """One row per store, the columns docs/stores.md shows."""
    stores = sorted({r["store"] for r in results})

    def get(store: str, bench: str, key: str, **match: Any) -> Any:
        for r in results:
            if r["store"] == store and r["bench"] == bench and all(r.get(k) == v for k, v in match.items()):
                return r.get(key)
        return None

    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    def k(v: Any) -> str:
        return "-" if v is None else f"{v / 1000:,.0f}k"

    head = ("| store | append 100 B x1000 (rec/s) | append 1 KiB x1000 | append 100 B x1 | append 1 KiB x1 "
            "| append 1 KiB x1000 sync | random read (reads/s) | sequential read (rec/s) "
            "| read after a restart, 1024 a pull (rec/s) | disk B/record "
            "| recover after kill -9 (s) | clean reopen (s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in stores:
        lines.append("| " + " | ".join([
            s,
            k(get(s, "append", "records_per_s", record_bytes=100, batch=BATCH)),
            k(get(s, "append", "records_per_s", record_bytes=1024, batch=BATCH)),
            k(get(s, "append", "records_per_s", record_bytes=100, batch=1)),
            k(get(s, "append", "records_per_s", record_bytes=1024, batch=1)),
            k(get(s, "append_sync", "records_per_s")),
            k(get(s, "read_random", "reads_per_s")),
            k(get(s, "read_sequential", "records_per_s")),
            k(get(s, "read_after_restart", "records_per_s")),
            num(get(s, "disk", "bytes_per_record"), "{:.0f}"),
            num(get(s, "recover_unclean", "seconds"), "{:.3f}"),
            num(get(s, "reopen_clean", "seconds"), "{:.3f}"),
        ]) + " |")
    return "\n".join(lines)


def medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several runs merged: each numeric field is the median over the runs (a noisy
    machine makes one run's numbers wobble by tens of percent)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for rows in runs:
        for r in rows:
            key = (r["store"], r["bench"], r.get("record_bytes"), r.get("batch"), r.get("flush"))
            groups.setdefault(key, []).append(r)
    out = []
    for rows in groups.values():
        merged = dict(rows[0])
        for field_name, value in rows[0].items():
            if isinstance(value, (int, float)) and field_name not in ("record_bytes", "batch"):
                merged[field_name] = statistics.median(r[field_name] for r in rows)
        merged["runs"] = len(rows)
        out.append(merged)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=1_000_000, help="N: records filled per store (default 1M)")
    p.add_argument("--random-reads", type=int, default=20_000)
    p.add_argument("--single", type=int, default=20_000, help="records for the one-record-per-append runs")
    p.add_argument("--stores", default="", help="comma-separated store names (default: all installed)")
    p.add_argument("--dir", default=None, help="where to put the data (default: a new temp dir)")
    p.add_argument("--table", action="store_true", help="also print a markdown table to stderr")
    p.add_argument("--summarize", nargs="+", metavar="JSONL",
                   help="print the markdown table of the medians of earlier runs' output files, and exit")
    p.add_argument("--fill-child", nargs=3, metavar=("STORE", "DIR", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.summarize:
        runs = []
        for path in args.summarize:
            with open(path) as f:
                runs.append([json.loads(line) for line in f if line.startswith("{")])
        print(markdown(medians(runs)))
        return
    if args.fill_child:
        name, data_dir, n = args.fill_child
        fill_and_die(name, data_dir, int(n))
        return
    stores = [s for s in args.stores.split(",") if s] or get_plugin_manager().names("equeue_store_engines")
    root = tempfile.mkdtemp(prefix="equeue-bench-stores-", dir=args.dir)
    results: list[dict[str, Any]] = []

    def emit(store: str, bench: str, fields: dict[str, Any]) -> None:
        row = {"bench": bench, "store": store, **fields}
        results.append(row)
        print(json.dumps(row), flush=True)

    try:
        for name in stores:
            bench_store(name, root, args.records, args.random_reads, min(args.single, args.records), emit)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.table:
        print(markdown(results), file=sys.stderr)


if __name__ == "__main__":
    main()
