"""Micro-benchmark of the file store's hot paths (not a test): `python -m equeue_plugins.store_file.bench`.

Prints one JSON line per measurement: append cost per record (total, and what stamp_batch and
index_entries cost on their own, so the store's own share is visible) and read throughput.
Pass --profile to print the cProfile top functions of the append loop.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import tempfile
import time

from equeue_core import record
from equeue_core.contracts import StoreSettings

from .queue_index import FileQueueIndex
from .store import FileMessageStore


def _batch(n: int, body: int, queue_id: int) -> tuple[bytearray, list[int]]:
    one = record.encode_record("bench", b"x" * body, tag="t", queue_id=queue_id)
    buf = bytearray(one * n)
    return buf, record.scan(buf)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="equeue-bench-")
    try:
        settings = StoreSettings(d, flush="async", flush_interval_ms=500)
        store = FileMessageStore(settings, FileQueueIndex(settings))
        store.open()
        template, starts = _batch(args.batch, args.body, 0)
        n = args.batches * args.batch
        # the kernel's share, measured alone on the same data
        b = bytearray(template)
        t0 = time.perf_counter()
        for i in range(args.batches):
            record.stamp_batch(b, starts, [s + i for s in starts], i * args.batch, 0, 1)
        stamp = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(args.batches):
            record.index_entries(b, starts, starts)
        entries = (time.perf_counter() - t0) / n * 1e6
        t0 = time.perf_counter()
        for _ in range(args.batches):
            bytearray(template)
        copy = (time.perf_counter() - t0) / n * 1e6
        prof = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        for i in range(args.batches):
            store.append("bench", i % 4, bytearray(template), starts)
        if prof:
            prof.disable()
        total = (time.perf_counter() - t0) / n * 1e6
        print(json.dumps({"bench": "file_store_append", "records": n, "body": args.body,
                          "us_per_record": round(total - copy, 3), "stamp_batch_us": round(stamp, 3),
                          "index_entries_us": round(entries, 3),
                          "store_own_us": round(total - copy - stamp - entries, 3)}))
        store.flush()
        t0 = time.perf_counter()
        got = 0
        for q in range(4):
            off = 0
            while True:
                r = store.read_queue("bench", q, off, 32, 4 << 20)
                if not r.count:
                    break
                got += r.count
                off = r.next_offset
        dt = time.perf_counter() - t0
        print(json.dumps({"bench": "file_store_read_queue_32", "records": got,
                          "msgs_per_s": round(got / dt), "us_per_record": round(dt / got * 1e6, 3)}))
        t0 = time.perf_counter()
        got = 0
        for q in range(4):
            off = 0
            while True:
                r = store.read_queue("bench", q, off, 1000, 16 << 20)
                if not r.count:
                    break
                got += r.count
                off = r.next_offset
        dt = time.perf_counter() - t0
        print(json.dumps({"bench": "file_store_read_queue_1000", "records": got,
                          "msgs_per_s": round(got / dt), "us_per_record": round(dt / got * 1e6, 3)}))
        store.close()
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
