"""Cluster benchmarks: aggregate produce and consume throughput over 1, 2 and 3 brokers, and the
time from `kill -9` of a broker to the first successful send on another.

One name server and N brokers, each its own process on 127.0.0.1; the producer and the consumer
each run in their own process and route through the name server (`nameserver=`). Prints one JSON
line per measurement, like bench/bench_broker.py.

    .venv/bin/python -m bench.bench_cluster                       # 1, 2, 3 brokers + failover
    .venv/bin/python -m bench.bench_cluster --brokers 3 --count 200000 --only throughput

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.answer_window import AnswerWindow  # noqa: E402
from bench.child import role_result  # noqa: E402
from tests.helpers.broker import BrokerProcess  # noqa: E402
from tests.helpers.counting import CountingHandler  # noqa: E402
from tests.helpers.nameserver import NameServerProcess, cluster_args  # noqa: E402

NAMES = ("broker-a", "broker-b", "broker-c")


def emit(result: dict) -> None:
    print(json.dumps(result), flush=True)


def _child(args: list[str], timeout: float = 900) -> dict:
    return role_result([sys.executable, "-m", "bench.bench_cluster", "--role", *args], what=f"role {args[0]}",
                       cwd=ROOT, timeout=timeout)


# ---------------------------------------------------------------- client roles (child processes)

def role_produce(nameserver: str, topic: str, count: int, size: int) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(nameserver=nameserver) as p:
        p.send(Message(topic, body))  # routes and connections warm
        start = time.perf_counter()
        window = AnswerWindow()
        for _ in range(count):
            window.add(p.send_async(Message(topic, body)))
        window.drain()
        elapsed = time.perf_counter() - start
    return {"count": count, "seconds": elapsed}


def role_consume(nameserver: str, topic: str, count: int) -> dict:

    from equeue_core.client import Consumer

    handler = CountingHandler(count)

    c = Consumer("bench", nameserver=nameserver, consume_from="first", pull_batch=256)
    start = time.perf_counter()
    c.subscribe(topic).start(handler)
    handler.done.wait(600)
    elapsed = time.perf_counter() - start
    c.close()
    return {"count": handler.seen, "seconds": elapsed}


# ---------------------------------------------------------------- measurements

@contextlib.contextmanager
def cluster(base: Path, brokers: int):
    with contextlib.ExitStack() as stack:
        ns = NameServerProcess(base).start()
        stack.callback(ns.stop)
        bs = []
        for name in NAMES[:brokers]:
            b = BrokerProcess(base / name, extra_args=cluster_args([ns], name)).start()
            stack.callback(b.stop)
            bs.append(b)
        yield ns, bs


def _children(n: int, args: list[str]) -> list[dict]:
    """n copies of a role at once, each its own process; their JSON lines."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.bench_cluster", "--role", *args], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(stderr[-2000:])
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def throughput(brokers: int, count: int, size: int, queues: int, producers: int = 1) -> None:
    from equeue_core.client import AdminClient

    base = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        with cluster(base, brokers) as (ns, _bs):
            with AdminClient(nameserver=ns.address) as admin:
                admin.create_topic("bench", queues)
            ps = _children(producers, ["produce", ns.address, "bench", str(count // producers), str(size)])
            total = sum(p["count"] for p in ps)
            seconds = max(p["seconds"] for p in ps)
            emit({"bench": "cluster_produce", "brokers": brokers, "producers": producers, "count": total,
                  "size": size, "queues_per_broker": queues, "msgs_per_s": round(total / seconds),
                  "seconds": round(seconds, 2)})
            c = _child(["consume", ns.address, "bench", str(total + producers)])
            emit({"bench": "cluster_consume", "brokers": brokers, "count": c["count"], "size": size,
                  "msgs_per_s": round(c["count"] / c["seconds"]), "seconds": round(c["seconds"], 2)})
    finally:
        shutil.rmtree(base, ignore_errors=True)


def failover(runs: int) -> None:
    """Send one message at a time round robin over 3 brokers; kill -9 one; time from the kill to
    the first acknowledged send on another broker, and to the last send routed to the dead one."""
    from equeue_core.client import AdminClient, Message, Producer
    from equeue_core.errors import TransportError

    for run in range(runs):
        base = Path(tempfile.mkdtemp(prefix="bench-failover-"))
        try:
            with cluster(base, 3) as (ns, bs):
                with AdminClient(nameserver=ns.address) as admin:
                    admin.create_topic("f", 4)
                with Producer(nameserver=ns.address, send_timeout=5.0) as p:
                    for _ in range(300):
                        p.send(Message("f", b"w"))
                    victim = bs[run % 3]
                    dead = NAMES[run % 3]
                    killed = time.perf_counter()
                    victim.kill()
                    first_other = None
                    failed = 0
                    sends = 0
                    while time.perf_counter() - killed < 3.0:
                        try:
                            r = p.send(Message("f", b"x"))
                        except TransportError:
                            failed += 1
                            continue
                        sends += 1
                        if first_other is None and r.broker != dead:
                            first_other = time.perf_counter() - killed
                    on_dead = [q for q in p._async._routes["f"].queues if q.broker == dead]
                emit({"bench": "cluster_failover", "run": run + 1, "killed": dead,
                      "first_send_on_another_ms": round(first_other * 1000, 2) if first_other else None,
                      "failed_sends": failed, "acked_sends_in_3s": sends,
                      "dead_broker_still_in_route": bool(on_dead)})
        finally:
            shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--role":
        role, *rest = sys.argv[2:]
        if role == "produce":
            out = role_produce(rest[0], rest[1], int(rest[2]), int(rest[3]))
        else:
            out = role_consume(rest[0], rest[1], int(rest[2]) - 1)
        print(json.dumps(out), flush=True)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["throughput", "failover"])
    ap.add_argument("--brokers", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--producers", type=int, default=1, help="producer processes at once")
    args = ap.parse_args()
    if args.only in (None, "throughput"):
        for n in args.brokers:
            throughput(n, args.count, args.size, args.queues, args.producers)
    if args.only in (None, "failover"):
        failover(args.runs)


if __name__ == "__main__":
    main()
