"""RabbitMQ driver: rabbitmq-server (Debian) started here as its own node (own node name, AMQP and
distribution ports, mnesia and log dirs, Erlang cookie in a tmp HOME, its own epmd on a free port)
so a system instance is neither used nor disturbed; driven by the async aio-pika client.

Two systems on that one node: quorum queues and classic durable queues (persistent messages).
produce: aio-pika publishes with publisher confirms, windows of 1000 awaited together (the fastest
confirmed pattern here); the rest with pika's BlockingConnection, which works in the caller's
thread: consume with basic_consume, prefetch 1000, acks with multiple=True every 100 messages;
latency: persistent publishes paced, a consumer in another process; single: a publish waiting for
its confirm. Durability: a confirm comes after the message is on disk.
"""

from __future__ import annotations

import asyncio
import os
import shutil
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
)

SYSTEMS = ["rabbitmq-quorum", "rabbitmq-classic"]
PRODUCE_MODES = ["batch"]
SERVER_VARIANTS = [{}]
PREFETCH = 1000


def durability(system: str, opts: dict) -> str:
    if system == "rabbitmq-quorum":
        return "quorum queue, publisher confirms"
    return "classic durable queue, persistent messages, publisher confirms"


def missing() -> str | None:
    return missing_binary("rabbitmq-server", "epmd") or missing_module("aio_pika", "pika")


def _server_script() -> str:
    """The real start script: Debian's /usr/sbin/rabbitmq-server wrapper switches to the system's
    rabbitmq user and its environment, which would share the system instance's files."""
    found = shutil.which("rabbitmq-server")
    assert found is not None
    real = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    return str(real) if real.exists() else found


@contextmanager
def server(tmp: Path) -> Iterator[dict]:
    amqp, dist, epmd_port = free_port(), free_port(), free_port()
    home = tmp / "home"
    home.mkdir()
    cookie = home / ".erlang.cookie"
    cookie.write_text(os.urandom(16).hex())
    cookie.chmod(0o400)
    (tmp / "enabled_plugins").write_text("[].\n")
    (tmp / "rabbitmq.conf").write_text("disk_free_limit.absolute = 50MB\nloopback_users.guest = true\n")
    (tmp / "rabbitmq-env.conf").write_text("")
    env = dict(os.environ, HOME=str(home), ERL_EPMD_PORT=str(epmd_port), ERL_EPMD_ADDRESS="127.0.0.1",
               RABBITMQ_NODENAME=f"bench{amqp}@localhost", RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
               RABBITMQ_NODE_PORT=str(amqp), RABBITMQ_DIST_PORT=str(dist),
               RABBITMQ_MNESIA_BASE=str(tmp / "mnesia"), RABBITMQ_LOG_BASE=str(tmp / "log"),
               RABBITMQ_CONFIG_FILE=str(tmp / "rabbitmq.conf"), RABBITMQ_CONF_ENV_FILE=str(tmp / "rabbitmq-env.conf"),
               RABBITMQ_ENABLED_PLUGINS_FILE=str(tmp / "enabled_plugins"),
               RABBITMQ_PID_FILE=str(tmp / "rabbit.pid"), RABBITMQ_LOGS="-")
    epmd = ServerProcess(["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"], tmp / "epmd.log",
                         env=env, cwd=tmp).start(epmd_port)
    try:
        srv = ServerProcess([_server_script()], tmp / "rabbitmq.log", env=env, cwd=tmp).start(amqp, timeout=120)
        try:
            yield {"port": amqp, "server_pid": srv.pid}
        finally:
            srv.stop(timeout=30)
    finally:
        epmd.stop()


async def _queue(info: dict, system: str, name: str, prefetch: int | None = None):
    import aio_pika

    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{info['port']}/")
    channel = await conn.channel(publisher_confirms=True)
    if prefetch:
        await channel.set_qos(prefetch_count=prefetch)
    kind = "quorum" if system == "rabbitmq-quorum" else "classic"
    queue = await channel.declare_queue(f"{kind}-{name}", durable=True, arguments={"x-queue-type": kind})
    return conn, channel, queue


def _message(body: bytes):
    import aio_pika

    return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


def produce(info: dict, system: str, name: str, size: int, count: int, mode: str, budget: float = 1e9) -> dict:
    async def go() -> dict:
        conn, channel, queue = await _queue(info, system, name)
        body = os.urandom(size)
        ex = channel.default_exchange
        start = time.perf_counter()
        done = 0
        for n in chunks(count, budget):
            await asyncio.gather(*(ex.publish(_message(body), routing_key=queue.name) for _ in range(n)))
            done += n
        elapsed = time.perf_counter() - start
        await conn.close()
        return rate_row(done, elapsed)

    return asyncio.run(go())


def _blocking(info: dict, system: str, name: str, prefetch: int | None = None, confirms: bool = False):
    """A pika BlockingConnection channel (the client works in the caller's thread) on the queue."""
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", info["port"], credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    if confirms:
        ch.confirm_delivery()
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    kind = "quorum" if system == "rabbitmq-quorum" else "classic"
    queue = f"{kind}-{name}"
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
    return conn, ch, queue


def _persistent():
    import pika

    return pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)


def consume(info: dict, system: str, name: str, count: int) -> dict:
    conn, ch, queue = _blocking(info, system, name, prefetch=PREFETCH)
    got = 0

    def on_message(channel, method, properties, body) -> None:
        nonlocal got
        got += 1
        if got % 100 == 0 or got >= count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if got >= count:
            channel.stop_consuming()

    ch.basic_consume(queue, on_message)
    conn.call_later(600, ch.stop_consuming)
    start = time.perf_counter()
    ch.start_consuming()
    elapsed = time.perf_counter() - start
    conn.close()
    return rate_row(got, elapsed)


def single(info: dict, system: str, name: str, size: int, count: int, budget: float = 1e9) -> dict:
    conn, ch, queue = _blocking(info, system, name, confirms=True)
    body = os.urandom(size)
    props = _persistent()
    ch.basic_publish("", queue, body, props)
    start = time.perf_counter()
    done = 0
    for n in chunks(count, budget, 50):
        for _ in range(n):
            ch.basic_publish("", queue, body, props)  # waits for the confirm
        done += n
    elapsed = time.perf_counter() - start
    conn.close()
    return rate_row(done, elapsed)


def latency_receiver(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                     spin: bool) -> dict:
    conn, ch, queue = _blocking(info, system, name, prefetch=PREFETCH)
    ch.queue_purge(queue)
    lat = Latencies()

    def on_message(channel, method, properties, body) -> None:
        lat.add(body)
        if len(lat) % 100 == 0 or len(lat) >= count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if len(lat) >= count:
            channel.stop_consuming()

    ch.basic_consume(queue, on_message)
    conn.call_later(seconds + 30, ch.stop_consuming)
    print("ready", flush=True)
    ch.start_consuming()
    conn.close()
    return lat.summary()


def latency_sender(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                   spin: bool) -> dict:
    """Publishes without waiting for confirms (a confirm round trip is ~1 ms, longer than the
    pace's 0.2 ms); messages are persistent, and a quorum queue delivers only committed entries."""
    conn, ch, queue = _blocking(info, system, name)
    props = _persistent()
    row = paced(count, rate, spin, lambda i, due: ch.basic_publish("", queue, stamp(size, due), props))
    conn.close()
    return row
