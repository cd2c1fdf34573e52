"""Micro-benchmark of the file store's hot paths (not a test):

    .venv/bin/python -m equeue_plugins.store_file.bench [--profile]

Prints one JSON line per measurement (best of --rounds): append cost per record, next to what
record.stamp_batch and record.index_entries (kernel code the store must call) cost alone on the
same batches, so the store's own share is visible; then read_queue throughput from the in-memory
ring and from mmap'd chunks. --profile prints the cProfile top functions of one append round.
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


def _open(d: str, **options: object) -> FileMessageStore:
    settings = StoreSettings(d, flush="async", flush_interval_ms=500, options=dict(options))
    store = FileMessageStore(settings, FileQueueIndex(settings))
    store.open()
    return store


def _append_round(store: FileMessageStore, template: bytearray, starts: list[int], batches: int,
                  prof: cProfile.Profile | None = None) -> float:
    bufs = [bytearray(template) for _ in range(batches)]
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    for i, b in enumerate(bufs):
        store.append("bench", i % 4, b, starts)
    if prof:
        prof.disable()
    return time.perf_counter() - t0


def _kernel_round(template: bytearray, starts: list[int], batches: int) -> tuple[float, float]:
    bufs = [bytearray(template) for _ in range(batches)]
    positions = [s + 1000 for s in starts]
    t0 = time.perf_counter()
    for i, b in enumerate(bufs):
        record.stamp_batch(b, starts, positions, i * len(starts), 0, 1)
    t1 = time.perf_counter()
    for b in bufs:
        record.index_entries(b, starts, positions)
    return t1 - t0, time.perf_counter() - t1


def _read_round(store: FileMessageStore, per_pull: int) -> tuple[int, float]:
    got = 0
    t0 = time.perf_counter()
    for q in range(4):
        off = store.queue_range("bench", q)[0]
        for _ in range(10**7):
            r = store.read_queue("bench", q, off, per_pull, 64 << 20)
            if not r.count:
                break
            got += r.count
            off = r.next_offset
    return got, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    one = record.encode_record("bench", b"x" * args.body, tag="t")
    template = bytearray(one * args.batch)
    starts = record.scan(template)
    n = args.batches * args.batch
    d = tempfile.mkdtemp(prefix="equeue-bench-")
    try:
        store = _open(d)
        append_s = min(_append_round(store, template, starts, args.batches) for _ in range(args.rounds))
        kernel = [_kernel_round(template, starts, args.batches) for _ in range(args.rounds)]
        stamp_s = min(k[0] for k in kernel)
        entries_s = min(k[1] for k in kernel)
        us = 1e6 / n
        print(json.dumps({"bench": "file_store_append", "records_per_round": n, "body_bytes": args.body,
                          "record_bytes": len(one), "append_us_per_record": round(append_s * us, 3),
                          "stamp_batch_us": round(stamp_s * us, 3), "index_entries_us": round(entries_s * us, 3),
                          "beyond_stamp_batch_us": round((append_s - stamp_s) * us, 3),
                          "store_own_us": round((append_s - stamp_s - entries_s) * us, 3)}))
        store.flush()
        for per_pull in (32, 1000):
            got, dt = min((_read_round(store, per_pull) for _ in range(args.rounds)), key=lambda x: x[1])
            print(json.dumps({"bench": f"file_store_read_queue_{per_pull}_ring_or_mmap", "records": got,
                              "msgs_per_s": round(got / dt), "mb_per_s": round(got * len(one) / dt / 1e6)}))
        store.close()
        store = _open(d, ring_bytes=0)  # reopened: every read comes from mmap'd chunks
        got, dt = min((_read_round(store, 32) for _ in range(args.rounds)), key=lambda x: x[1])
        print(json.dumps({"bench": "file_store_read_queue_32_mmap_only", "records": got,
                          "msgs_per_s": round(got / dt), "mb_per_s": round(got * len(one) / dt / 1e6)}))
        if args.profile:
            prof = cProfile.Profile()
            _append_round(store, template, starts, args.batches, prof)
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        store.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
