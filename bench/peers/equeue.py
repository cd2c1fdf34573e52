"""EQueue driver: our broker as a real process (tests/helpers/broker.py BrokerProcess, tcp, file
store), driven through the public client API (`equeue_core.client`).

produce: `send_batch` of 1000 and `send_async` (auto batching); consume: one Consumer at its
default settings draining a backlog; latency: `send` paced (each waits for its acknowledgement, as XADD does) and `send_async`
paced (as the NATS and RabbitMQ senders, which do not wait), a LitePullConsumer polling in another
process (and, as the extra `sleep-push` and `sleep-push_pulling` rows, the push Consumer with a
handler, by default and with `pull_in_handler_threads=True`);
single: `send` waiting for each answer. Durability: flush=async (fsync every flush_interval_ms)
and flush=sync (a send is answered after its data is durable).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.answer_window import AnswerWindow
from bench.peers.common import Latencies, chunks, paced, rate_row, stamp, warmup_body
from tests.helpers.counting import CountingHandler

SYSTEMS = ["equeue"]
PRODUCE_MODES = ["batch", "async"]
SERVER_VARIANTS = [{"flush": "async"}, {"flush": "sync"}]  # sync: produce and single sends only
# Latency rows only EQueue has: (mode, sender's thread spins, the Producer call); the table
# compares them with the peers' row of the same sender behaviour.
# The receiver is the LitePullConsumer unless the call ends in "/push" (the push Consumer) or
# "/push_pulling" (the push Consumer whose handler threads pull: pull_in_handler_threads=True).
EXTRA_LATENCY_MODES = [("sleep-send_async", False, "send_async"), ("sleep-push", False, "send/push"),
                       ("sleep-push_pulling", False, "send/push_pulling")]


def durability(system: str, opts: dict) -> str:
    return {"async": "flush=async (fsync every 500 ms)",
            "sync": "flush=sync (fsync before the answer)"}[opts["flush"]]


def missing() -> str | None:
    return None  # our own broker and client are always there


@contextmanager
def server(tmp: Path, flush: str = "async") -> Iterator[dict]:
    from tests.helpers.broker import BrokerProcess

    b = BrokerProcess(tmp / f"equeue-{flush}", store="file", transport="tcp", flush=flush).start()
    try:
        yield {"address": b.address, "offset_dir": str(tmp / f"equeue-{flush}-client-offsets"),
               "server_pid": b.proc.pid}
    finally:
        b.stop()


def produce(info: dict, system: str, name: str, size: int, count: int, mode: str, budget: float = 1e9) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(info["address"]) as p:
        p.send(Message(name, body))  # route lookup and connection warm-up, not timed
        start = time.perf_counter()
        done = 0
        if mode == "batch":
            msgs = [Message(name, body) for _ in range(1000)]
            for n in chunks(count, budget):
                p.send_batch(msgs[:n])
                done += n
        else:
            window = AnswerWindow()
            for n in chunks(count, budget):
                window.extend(p.send_async(Message(name, body)) for _ in range(n))
                done += n
            window.drain()
        elapsed = time.perf_counter() - start
    return rate_row(done, elapsed)


def consume(info: dict, system: str, name: str, count: int) -> dict:
    """Drain `count` messages of topic `name` with one Consumer at its default settings (pull
    batch, threads, flow control) from the first offset; the warm-up message counts too."""
    from equeue_core.client import Consumer

    handler = CountingHandler(count)

    c = Consumer(f"drain-{name}", info["address"], consume_from="first",
                 offset_dir=info["offset_dir"])
    c.subscribe(name)
    start = time.perf_counter()
    c.start(handler)
    handler.done.wait(600)
    elapsed = time.perf_counter() - start
    c.close()
    return rate_row(handler.seen, elapsed)


def single(info: dict, system: str, name: str, size: int, count: int, budget: float = 1e9) -> dict:
    from equeue_core.client import Message, Producer

    body = os.urandom(size)
    with Producer(info["address"]) as p:
        p.send(Message(name, body))
        start = time.perf_counter()
        done = 0
        for n in chunks(count, budget, 50):
            for _ in range(n):
                p.send(Message(name, body))
            done += n
        elapsed = time.perf_counter() - start
    return rate_row(done, elapsed)


def _broker_gc(info: dict) -> tuple[int, float]:
    """The broker's GC collections so far and their summed pause in ms (BROKER_STATS latency.gc)."""
    from equeue_core.client import AdminClient

    with AdminClient(info["address"]) as admin:
        h = admin.stats()["latency"]["gc"]
    return sum(h["counts"]), h["sum"] * 1000


def _with_broker_gc(row: dict, info: dict, before: tuple[int, float]) -> dict:
    """A latency row plus the broker's GC collections during it: a request path that leaves
    reference cycles shows here before it shows in the percentiles (docs/benchmarks.md)."""
    after = _broker_gc(info)
    return {**row, "broker_gc_collections": after[0] - before[0],
            "broker_gc_ms": round(after[1] - before[1], 3)}


def latency_receiver(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                     spin: bool, call: str = "send") -> dict:
    """The LitePullConsumer (poll in this thread, as the Redis receiver's XREAD BLOCK); with a
    `call` ending in "/push" or "/push_pulling" (EXTRA_LATENCY_MODES rows) the push Consumer with
    a handler (the second with pull_in_handler_threads=True)."""
    from equeue_core.client import Message, Producer

    with Producer(info["address"]) as p:
        p.send(Message(name, warmup_body(size)))  # creates the topic before the consumer subscribes
    if call.endswith(("/push", "/push_pulling")):
        return _push_latency(info, name, count, seconds, pulling=call.endswith("/push_pulling"))
    from equeue_core.client import LitePullConsumer

    lat = Latencies()
    c = LitePullConsumer(f"latency-{name}", info["address"], consume_from="last")
    try:
        c.subscribe(name)
        c.poll(0.2)  # the first pulls are in flight before the sender starts
        gc_before = _broker_gc(info)
        print("ready", flush=True)
        deadline = time.monotonic() + seconds + 30
        while len(lat) < count and time.monotonic() < deadline:
            for m in c.poll(1.0):
                lat.add(m.body)
    finally:
        c.close()
    return _with_broker_gc(lat.summary(), info, gc_before)


def _push_latency(info: dict, name: str, count: int, seconds: float, pulling: bool = False) -> dict:
    from equeue_core.client import Consumer

    lat = Latencies()
    lock = threading.Lock()
    done = threading.Event()

    def handler(m) -> None:
        now = time.time_ns()  # before the lock, which other handler threads may hold
        with lock:
            if lat.add(m.body, now) and len(lat) >= count:
                done.set()

    options = {"pull_in_handler_threads": True} if pulling else {"offset_dir": info["offset_dir"]}
    c = Consumer(f"latency-{name}", info["address"], consume_from="last", **options)
    c.subscribe(name)
    c.start(handler)
    deadline = time.monotonic() + 30  # ready once the first rebalance has set the queues' offsets
    while not c.assigned_queues() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    gc_before = _broker_gc(info)
    print("ready", flush=True)
    done.wait(seconds + 30)
    c.close()
    with lock:
        return _with_broker_gc(lat.summary(), info, gc_before)


def latency_sender(info: dict, system: str, name: str, size: int, count: int, rate: int, seconds: float,
                   spin: bool, call: str = "send") -> dict:
    """`send` waits for each acknowledgement, as the Redis sender's XADD does; `send_async` (the
    EXTRA_LATENCY_MODES row) hands each message to the client's batching loop and waits only at
    the end, as the NATS (publish_async) and RabbitMQ (no confirms) senders do not wait either."""
    from equeue_core.client import Message, Producer

    with Producer(info["address"]) as p:
        p.send(Message(name, warmup_body(size)))
        send = p.send if call.split("/")[0] == "send" else p.send_async
        row = paced(count, rate, spin, lambda i, due: send(Message(name, stamp(size, due))))
        p.flush()
    return row
