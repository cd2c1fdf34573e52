"""NATS JetStream driver: nats-server -js (Debian) with file storage in a tmp dir, driven by the
async nats-py client.

produce: `publish_async` (acks collected as futures, the client's own window); consume: a durable
pull consumer with ack policy "all", fetches of 1000 and one ack of each batch's last message
(at-least-once, as our committed offsets); latency: `publish_async` paced, a push subscription in
another process (JetStream's low-latency delivery); single: `publish` awaiting each ack.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.peers.common import (
    Latencies,
    Pace,
    ServerProcess,
    chunks,
    free_port,
    missing_binary,
    missing_module,
    rate_row,
    sender_row,
    stamp,
)

SYSTEMS = ["nats-jetstream"]
PRODUCE_MODES = ["batch"]
SERVER_VARIANTS = [{}]


def durability(system: str, opts: dict) -> str:
    return "file storage (server's default sync interval)"


def missing() -> str | None:
    return missing_binary("nats-server") or missing_module("nats")


@contextmanager
def server(tmp: Path) -> Iterator[dict]:
    port = free_port()
    srv = ServerProcess(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp / "js")],
                        tmp / "nats.log", cwd=tmp).start(port)
    try:
        yield {"port": port, "server_pid": srv.pid}
    finally:
        srv.stop()


async def _connect(info: dict, name: str):
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(f"nats://127.0.0.1:{info['port']}")
    js = nc.jetstream()
    await js.add_stream(name=f"S{name}", subjects=[name], storage=StorageType.FILE)
    return nc, js


def produce(info: dict, system: str, name: str, size: int, count: int, mode: str, budget: float = 1e9) -> dict:
    async def go() -> dict:
        nc, js = await _connect(info, name)
        body = os.urandom(size)
        start = time.perf_counter()
        futures = []
        for n in chunks(count, budget):
            futures.extend([await js.publish_async(name, body) for _ in range(n)])
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - start
        await nc.close()
        return rate_row(len(futures), elapsed)

    return asyncio.run(go())


def consume(info: dict, system: str, name: str, count: int) -> dict:
    from nats.js.api import AckPolicy, ConsumerConfig

    async def go() -> dict:
        nc, js = await _connect(info, name)
        sub = await js.pull_subscribe(name, "drain", config=ConsumerConfig(ack_policy=AckPolicy.ALL))
        got = 0
        start = time.perf_counter()
        while got < count:
            msgs = await sub.fetch(1000, timeout=10)
            await msgs[-1].ack()
            got += len(msgs)
        elapsed = time.perf_counter() - start
        await nc.close()
        return rate_row(got, elapsed)

    return asyncio.run(go())


def single(info: dict, system: str, name: str, size: int, count: int, budget: float = 1e9) -> dict:
    async def go() -> dict:
        nc, js = await _connect(info, name)
        body = os.urandom(size)
        await js.publish(name, body)
        start = time.perf_counter()
        done = 0
        for n in chunks(count, budget, 50):
            for _ in range(n):
                await js.publish(name, body)
            done += n
        elapsed = time.perf_counter() - start
        await nc.close()
        return rate_row(done, elapsed)

    return asyncio.run(go())


def latency_receiver(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                     spin: bool) -> dict:
    from nats.js.api import DeliverPolicy

    async def go() -> dict:
        nc, js = await _connect(info, name)
        lat = Latencies()
        done = asyncio.Event()

        async def cb(msg) -> None:
            if lat.add(msg.data) and len(lat) >= count:
                done.set()

        await js.subscribe(name, cb=cb, deliver_policy=DeliverPolicy.NEW)
        await nc.flush()
        print("ready", flush=True)
        try:
            await asyncio.wait_for(done.wait(), seconds + 30)
        except TimeoutError:
            pass
        await nc.close()
        return lat.summary()

    return asyncio.run(go())


def latency_sender(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                   spin: bool) -> dict:
    async def go() -> dict:
        nc, js = await _connect(info, name)
        futures = []
        pace = Pace(rate)
        cpu = time.process_time()
        for i in range(count):
            if not spin and (delay := pace.remaining(i)):
                await asyncio.sleep(delay)
            due = pace.wait(i, spin=True)
            futures.append(await js.publish_async(name, stamp(size, due)))
            if spin:
                await asyncio.sleep(0)  # the one turn of the loop a busy caller gives its client
        row = sender_row(count, time.perf_counter() - pace.start, time.process_time() - cpu, spin)
        await asyncio.gather(*futures)
        await nc.close()
        return row

    return asyncio.run(go())
