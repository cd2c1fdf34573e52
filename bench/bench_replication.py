"""Replication benchmarks: produce throughput and send latency (p50/p99) of a master with no
replica, with an async replica, and with a sync replica (docs/replication.md).

Each broker is its own process on 127.0.0.1 (tests/helpers/broker.py); the producer runs here.
Throughput: `--count` messages of `--size` bytes sent with send_async (a window of 20,000 in
flight, batched by the producer). Latency: `--latency-count` single sends one after the other,
timed at the client. Prints one JSON line per measurement, like bench/bench_broker.py.

    .venv/bin/python -m bench.bench_replication
    .venv/bin/python -m bench.bench_replication --count 200000 --flush sync

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.answer_window import AnswerWindow

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.broker import BrokerProcess  # noqa: E402
from tests.helpers.waiting import wait_until  # noqa: E402

GROUP = ["--cluster", "bench", "--name", "broker-a"]


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


def _status(address: str) -> dict:
    from equeue_core.client.admin import AdminClient
    from equeue_core.codes import Code

    with AdminClient(address) as admin:
        return admin.request(Code.REPL_STATUS, {})


def _measure(address: str, count: int, size: int, latency_count: int) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(address) as p:
        p.send(Message("bench", body))  # route and connection warm
        start = time.perf_counter()
        window = AnswerWindow()
        for _ in range(count):
            window.add(p.send_async(Message("bench", body)))
        window.drain()
        elapsed = time.perf_counter() - start
        lat = []
        for _ in range(latency_count):
            t = time.perf_counter()
            p.send(Message("bench", body))
            lat.append(time.perf_counter() - t)
    lat.sort()
    return {"count": count, "size": size, "seconds": round(elapsed, 3), "msgs_per_s": round(count / elapsed),
            "mb_per_s": round(count * size / elapsed / 1e6, 1),
            "send_p50_ms": round(lat[len(lat) // 2] * 1000, 3),
            "send_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3)}


def run(setup: str, args: argparse.Namespace, root: Path) -> dict:
    mode = "sync" if setup == "sync_replica" else "async"
    m = BrokerProcess(root / f"{setup}-m", store=args.store, flush=args.flush,
                      extra_args=[*GROUP, "--broker-id", "0", "--replication", mode])
    r = None
    if setup != "no_replica":
        r = BrokerProcess(root / f"{setup}-r", store=args.store, flush=args.flush,
                          extra_args=[*GROUP, "--broker-id", "1", "--role", "replica", "--master",
                                      f"127.0.0.1:{m.port}"])
    with contextlib.ExitStack() as stack:
        stack.enter_context(m.start())
        if r is not None:
            stack.enter_context(r.start())
            wait_until(lambda: 1 in _status(m.address)["in_sync"], 30, 0.1)
        result = _measure(m.address, args.count, args.size, args.latency_count)
        if r is not None:
            end = _status(m.address)["log_end"]
            caught = wait_until(lambda: _status(r.address)["log_end"] >= end, 120, 0.1)
            result["replica_caught_up"] = caught
    return {"bench": "replication", "setup": setup, "store": args.store, "flush": args.flush, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--latency-count", type=int, default=2000)
    ap.add_argument("--store", default="file")
    ap.add_argument("--flush", choices=["async", "sync"], default="async")
    ap.add_argument("--only", choices=["no_replica", "async_replica", "sync_replica"])
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="equeue-bench-repl-"))
    try:
        for setup in ("no_replica", "async_replica", "sync_replica"):
            if args.only in (None, setup):
                emit(run(setup, args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
