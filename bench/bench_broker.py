"""Broker benchmarks: produce, consume and end-to-end latency, with peers in the same run.

Every measurement runs a real broker process and a real client process on 127.0.0.1 and prints
one JSON line. Ratios against peers (Redis Streams with AOF everysec and 1000-command pipelines;
NATS JetStream with file storage; each when its server and Python client are installed:
`apt-get install redis-server nats-server`, `pip install redis nats-py`) come from the same run
on the same machine.

    .venv/bin/python -m bench.bench_broker                    # everything, default sizes
    .venv/bin/python -m bench.bench_broker --only produce --count 200000
    .venv/bin/python -m bench.bench_broker --only consume --consumers 3 --orderly

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.answer_window import AnswerWindow  # noqa: E402
from bench.child import role_result  # noqa: E402
from tests.helpers.broker import BrokerProcess, free_port  # noqa: E402
from tests.helpers.counting import CountingHandler  # noqa: E402


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


def _child(args: list[str], timeout: float = 600) -> dict:
    """Run a client role of this module in its own process; it prints one JSON line."""
    return role_result([sys.executable, "-m", "bench.bench_broker", "--role", *args], what=f"role {args[0]}",
                       cwd=ROOT, timeout=timeout)


# ---------------------------------------------------------------- client roles (child processes)

def role_produce(address: str, topic: str, count: int, size: int, mode: str) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(address) as p:
        p.send(Message(topic, body))  # route lookup and connection warm-up
        start = time.perf_counter()
        if mode == "batch":
            msgs = [Message(topic, body) for _ in range(1000)]
            for _ in range(count // 1000):
                p.send_batch(msgs)
        elif mode == "async":
            window = AnswerWindow()
            for _ in range(count):
                window.add(p.send_async(Message(topic, body)))
            window.drain()
        else:
            for _ in range(count):
                p.send(Message(topic, body))
        elapsed = time.perf_counter() - start
    return {"count": count, "seconds": elapsed, "msgs_per_s": count / elapsed}


def role_consume(address: str, topic: str, count: int, group: str, orderly: bool, consumers: int,
                 pull_batch: int = 256) -> dict:
    from equeue_core.client import Consumer

    handler = CountingHandler(count)

    cs = [Consumer(group, address, consume_from="first", orderly=orderly, pull_batch=pull_batch).subscribe(topic)
          for _ in range(consumers)]
    start = time.perf_counter()
    for c in cs:
        c.start(handler)
    handler.done.wait(600)
    elapsed = time.perf_counter() - start
    for c in cs:
        c.close()
    return {"count": handler.seen, "seconds": elapsed, "msgs_per_s": handler.seen / elapsed}


def role_latency(address: str, topic: str, rate: int, seconds: float) -> dict:
    from equeue_core.client import Consumer, Message, Producer

    lat: list[float] = []
    lock = threading.Lock()

    def handler(m) -> None:
        sent = int.from_bytes(m.body[:8], "little")
        with lock:
            lat.append((time.time_ns() - sent) / 1e6)

    c = Consumer("latency", address, consume_from="last").subscribe(topic)
    with Producer(address) as p:
        p.send(Message(topic, b"\0" * 100))
        c.start(handler)
        time.sleep(1.0)
        n = int(rate * seconds)
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            p.send_async(Message(topic, time.time_ns().to_bytes(8, "little") + b"\0" * 92))
        p.flush()
    deadline = time.monotonic() + 10
    while len(lat) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    c.close()
    lat.sort()
    return {"count": len(lat), "p50_ms": lat[len(lat) // 2], "p99_ms": lat[int(len(lat) * 0.99)],
            "mean_ms": statistics.fmean(lat)}


# ---------------------------------------------------------------- peers

def redis_available() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


def role_redis(port: int, count: int, size: int) -> dict:
    import redis

    r = redis.Redis(port=port)
    body = os.urandom(size)
    start = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd("bench", {"b": body})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    produce = time.perf_counter() - start
    start = time.perf_counter()
    last = "0"
    got = 0
    while got < count:
        resp = r.xread({"bench": last}, count=1000)
        if not resp:
            break
        entries = resp[0][1]
        got += len(entries)
        last = entries[-1][0]
    consume = time.perf_counter() - start
    return {"produce_msgs_per_s": count / produce, "consume_msgs_per_s": got / consume}


def run_peer(peer: str, role: str, server_cmd: list[str], settle_s: float, count: int, size: int) -> dict:
    """Start a peer server on a free loopback port with a fresh data dir ({port} and {dir} in
    server_cmd are filled in), run its client role in a child process, stop it, clean up."""
    port = free_port()
    d = tempfile.mkdtemp(prefix=f"{role}-bench-")
    cmd = [part.format(port=port, dir=d) for part in server_cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle_s)
        res = _child([role, str(port), str(count), str(size)])
        emit({"bench": "peer", "peer": peer, "size": size, **res})
        return res
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def run_redis(count: int, size: int) -> dict | None:
    if not redis_available():
        emit({"bench": "peer", "peer": "redis-streams", "skipped": "redis-server or redis-py not installed"})
        return None
    return run_peer("redis-streams", "redis",
                    ["redis-server", "--port", "{port}", "--bind", "127.0.0.1", "--dir", "{dir}",
                     "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""], 0.5, count, size)


def nats_available() -> bool:
    try:
        import nats  # noqa: F401
    except ImportError:
        return False
    return shutil.which("nats-server") is not None


def role_nats(port: int, count: int, size: int) -> dict:
    """NATS JetStream, file storage: publishes awaited in windows of 1000 (acks), pull-consumed in
    fetches of 1000 with no per-message ack (the fairest match to our offset commits)."""
    import asyncio

    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    async def go() -> dict:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        await js.add_stream(name="BENCH", subjects=["bench"], storage=StorageType.FILE)
        body = os.urandom(size)
        start = time.perf_counter()
        for _ in range(count // 1000):
            await asyncio.gather(*(js.publish("bench", body) for _ in range(1000)))
        produce = time.perf_counter() - start
        sub = await js.pull_subscribe("bench", "drain", config=ConsumerConfig(ack_policy=AckPolicy.NONE))
        start = time.perf_counter()
        got = 0
        while got < count:
            msgs = await sub.fetch(1000, timeout=10)
            got += len(msgs)
        consume = time.perf_counter() - start
        await nc.close()
        return {"produce_msgs_per_s": count / produce, "consume_msgs_per_s": got / consume}

    return asyncio.run(go())


def run_nats(count: int, size: int) -> dict | None:
    if not nats_available():
        emit({"bench": "peer", "peer": "nats-jetstream", "skipped": "nats-server or nats-py not installed"})
        return None
    return run_peer("nats-jetstream", "nats",
                    ["nats-server", "-a", "127.0.0.1", "-p", "{port}", "-js", "-sd", "{dir}"], 0.8, count, size)


# ---------------------------------------------------------------- orchestration

def run(args: argparse.Namespace) -> None:
    only = set(args.only.split(",")) if args.only else {"produce", "consume", "latency", "peers"}
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="equeue-bench-") as tmp:
        for flush in (["async", "sync"] if "produce" in only else ["async"]):
            b = BrokerProcess(Path(tmp) / f"data-{flush}", store=args.store, transport=args.transport,
                              flush=flush).start()
            try:
                if "produce" in only:
                    for size in (100, 1024):
                        for mode in ("batch", "async", "single"):
                            count = args.count if mode != "single" else min(args.count, 20000)
                            if flush == "sync" and mode == "single":
                                count = min(count, 5000)
                            res = _child(["produce", b.address, f"p-{size}-{mode}", str(count), str(size), mode])
                            results[f"produce-{flush}-{size}-{mode}"] = res["msgs_per_s"]
                            emit({"bench": "produce", "store": args.store, "transport": args.transport,
                                  "flush": flush, "size": size, "mode": mode, **res})
                if flush == "async" and "consume" in only:
                    _child(["produce", b.address, "drain", str(args.count), "100", "batch"])
                    for pull_batch in (32, 256):
                        for orderly in (False, True):
                            for n in (1, 3):
                                res = _child(["consume", b.address, "drain", str(args.count),
                                              f"g-{orderly}-{n}-{pull_batch}", str(int(orderly)), str(n),
                                              str(pull_batch)])
                                mode = "orderly" if orderly else "concurrent"
                                results[f"consume-{mode}-{n}-{pull_batch}"] = res["msgs_per_s"]
                                emit({"bench": "consume", "store": args.store, "transport": args.transport,
                                      "mode": mode, "consumers": n, "pull_batch": pull_batch, "size": 100, **res})
                if flush == "async" and "latency" in only:
                    res = _child(["latency", b.address, "lat", "5000", str(args.latency_seconds)])
                    emit({"bench": "latency", "store": args.store, "rate": 5000, **res})
            finally:
                b.stop()
    if "peers" in only:
        ours_p = results.get("produce-async-100-batch")
        ours_c = results.get("consume-concurrent-1-32")
        for name, runner in (("redis-streams", run_redis), ("nats-jetstream", run_nats)):
            peer = runner(args.count, 100)
            if peer:
                emit({"bench": "ratio", "peer": name,
                      "produce_ratio": ours_p / peer["produce_msgs_per_s"] if ours_p else None,
                      "consume_ratio": ours_c / peer["consume_msgs_per_s"] if ours_c else None})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role"]:
        role, *rest = argv[1:]
        if role == "produce":
            out = role_produce(rest[0], rest[1], int(rest[2]), int(rest[3]), rest[4])
        elif role == "consume":
            out = role_consume(rest[0], rest[1], int(rest[2]), rest[3], bool(int(rest[4])), int(rest[5]),
                               int(rest[6]))
        elif role == "latency":
            out = role_latency(rest[0], rest[1], int(rest[2]), float(rest[3]))
        elif role == "redis":
            out = role_redis(int(rest[0]), int(rest[1]), int(rest[2]))
        elif role == "nats":
            out = role_nats(int(rest[0]), int(rest[1]), int(rest[2]))
        else:
            raise SystemExit(f"unknown role {role}")
        print(json.dumps(out))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--store", default="file")
    p.add_argument("--transport", default="tcp")
    p.add_argument("--only", help="comma list of produce,consume,latency,peers")
    p.add_argument("--latency-seconds", type=float, default=10.0)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
