"""Redis Streams driver: redis-server (Debian) with appendonly yes + appendfsync everysec, driven
by redis-py with hiredis in the caller's thread.

produce: XADD in non-transactional pipelines of 1000; consume: XREADGROUP COUNT 1000 from a
fresh group plus one XACK of each batch's ids (at-least-once, as our committed offsets); latency:
XADD one at a time (no pipeline), the receiver in XREAD BLOCK; single: XADD without a pipeline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.peers.common import (
    Latencies,
    ServerProcess,
    chunks,
    free_port,
    missing_binary,
    missing_module,
    paced,
    rate_row,
    stamp,
    warmup_body,
)

SYSTEMS = ["redis-streams"]
PRODUCE_MODES = ["batch"]
SERVER_VARIANTS = [{}]


def durability(system: str, opts: dict) -> str:
    return "AOF appendfsync everysec"


def missing() -> str | None:
    return missing_binary("redis-server") or missing_module("redis", "hiredis")


@contextmanager
def server(tmp: Path) -> Iterator[dict]:
    port = free_port()
    srv = ServerProcess(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp),
                         "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                         "--daemonize", "no", "--logfile", ""], tmp / "redis.log", cwd=tmp).start(port)
    try:
        yield {"port": port, "server_pid": srv.pid}
    finally:
        srv.stop()


def _client(info: dict):
    import redis

    return redis.Redis(host="127.0.0.1", port=info["port"])


def produce(info: dict, system: str, name: str, size: int, count: int, mode: str, budget: float = 1e9) -> dict:
    r = _client(info)
    body = os.urandom(size)
    r.ping()
    start = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    done = 0
    for n in chunks(count, budget):
        for _ in range(n):
            pipe.xadd(name, {"b": body})
        pipe.execute()
        done += n
    return rate_row(done, time.perf_counter() - start)


def consume(info: dict, system: str, name: str, count: int) -> dict:
    r = _client(info)
    r.xgroup_create(name, "drain", id="0")
    got = 0
    start = time.perf_counter()
    while got < count:
        resp = r.xreadgroup("drain", "c1", {name: ">"}, count=1000, block=1000)
        if not resp:
            break
        ids = [entry[0] for entry in resp[0][1]]
        r.xack(name, "drain", *ids)
        got += len(ids)
    return rate_row(got, time.perf_counter() - start)


def single(info: dict, system: str, name: str, size: int, count: int, budget: float = 1e9) -> dict:
    r = _client(info)
    body = os.urandom(size)
    r.xadd(name, {"b": body})
    start = time.perf_counter()
    done = 0
    for n in chunks(count, budget, 50):
        for _ in range(n):
            r.xadd(name, {"b": body})
        done += n
    return rate_row(done, time.perf_counter() - start)


def latency_receiver(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                     spin: bool) -> dict:
    r = _client(info)
    last = r.xadd(name, {"b": warmup_body(size)})  # read from here on: nothing the sender adds is missed
    lat = Latencies()
    print("ready", flush=True)
    deadline = time.monotonic() + seconds + 30
    while len(lat) < count and time.monotonic() < deadline:
        resp = r.xread({name: last}, count=1000, block=1000)
        if not resp:
            continue
        for entry_id, fields in resp[0][1]:
            lat.add(fields[b"b"])
            last = entry_id
    return lat.summary()


def latency_sender(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                   spin: bool) -> dict:
    r = _client(info)
    r.ping()
    return paced(count, rate, spin, lambda i, due: r.xadd(name, {"b": stamp(size, due)}))
