"""`send_async` batches written in the loop turn that dispatches them (AsyncProducer._send_now,
over the transport's `request_now`), their answers settled in the callback that reads them. What
it must keep, as the task path did: every message stored once its future says so, a retry on a
transport failure with the tries counted (the write that failed is the first), at least once
across a dropped connection, and flush() returning only when every batch is settled."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from equeue_core.client import AdminClient, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.producer import AsyncProducer
from equeue_core.codes import Code
from equeue_core.errors import RequestTimeoutError
from tests.helpers.broker import create_topic
from tests.helpers.consume import stored_bodies
from tests.helpers.proxy import CuttableProxy


def _count_task_path_sends(monkeypatch) -> list[int]:
    """SEND requests that went through BrokerConnection.request (the task path), counted; the
    request itself is the real one."""
    sends: list[int] = []
    real = BrokerConnection.request

    async def counting(self, code, header=None, body=b"", timeout=30.0):
        if code == Code.SEND:
            sends.append(1)
        return await real(self, code, header, body, timeout)

    monkeypatch.setattr(BrokerConnection, "request", counting)
    return sends


def test_a_burst_goes_out_without_a_task_and_every_message_is_stored(file_broker, monkeypatch):
    topics = [create_topic(file_broker, f"now-{i}", 2) for i in range(3)]
    sends = _count_task_path_sends(monkeypatch)
    sent = {t: [] for t in topics}

    with Producer(file_broker.address, max_batch_bytes=4096) as p:
        futures = []
        for i in range(3000):
            topic = topics[i % 3]
            body = f"{topic}-{i}".encode()
            sent[topic].append(body)
            futures.append(p.send_async(Message(topic, body)))
        results = [f.result(30) for f in futures]
    assert sends == []  # every batch was written at dispatch (a lone first one on the thread lane)
    assert len({(r.topic, r.queue_id, r.queue_offset) for r in results}) == 3000
    for topic in topics:
        assert sorted(stored_bodies(file_broker.address, topic, 1000)) == sorted(sent[topic])


def test_a_dropped_connection_sends_the_batches_again_and_nothing_answered_is_lost(file_broker, monkeypatch):
    """Batches are out (the proxy holds each answer back 20 ms) when the connection drops: they
    fail in their callbacks, go again on the task path and are answered after the reconnect."""
    topic = create_topic(file_broker, "now-drop", 4)
    sends = _count_task_path_sends(monkeypatch)
    proxy = CuttableProxy(file_broker.port, answer_delay=0.02)
    try:
        with Producer(proxy.address, max_batch_bytes=2048, retries=3) as p:
            futures = [p.send_async(Message(topic, f"a{i}".encode())) for i in range(300)]
            time.sleep(0.005)  # the first batches are written, none answered yet
            proxy.drop()
            futures += [p.send_async(Message(topic, f"b{i}".encode())) for i in range(300)]
            p.flush()
            errors = [f.exception(0) for f in futures]
    finally:
        proxy.close()
    assert errors == [None] * 600  # every message answered: retried past the drop
    assert sends, "no batch was out when the connection dropped (nothing went again on the task path)"
    with AdminClient(file_broker.address) as admin:  # at least once: a batch stored before the
        total = sum(high - low for low, high in admin.queue_ranges(topic))  # drop may be there twice
    assert total >= 600, total
    stored = stored_bodies(file_broker.address, topic, total)
    assert {f"{p}{i}".encode() for p in "ab" for i in range(300)} <= set(stored)


def test_a_broker_that_stops_answering_fails_the_batch_after_its_tries(file_broker, monkeypatch):
    """retries=1: the write at dispatch is the first try and the task path's the second, so the
    broker sees two SENDs of the batch, one of them through `request`, and the error says so."""
    topic = create_topic(file_broker, "now-frozen", 1)
    sends = _count_task_path_sends(monkeypatch)

    async def main() -> tuple[BaseException | None, float]:
        async with AsyncProducer(file_broker.address, send_timeout=0.5, retries=1) as p:
            await p.send(Message(topic, b"warm"))  # connected, route known
            os.kill(file_broker.proc.pid, signal.SIGSTOP)
            error = None
            started = time.monotonic()
            try:
                await asyncio.wait_for(p.send(Message(topic, b"frozen")), 20)
            except Exception as e:
                error = e
            finally:
                os.kill(file_broker.proc.pid, signal.SIGCONT)
            waited = time.monotonic() - started
            after = await p.send(Message(topic, b"after"))
            assert after.topic == topic
            return error, waited

    error, waited = asyncio.run(main())
    assert isinstance(error, RequestTimeoutError), error
    assert "after 2 tries" in str(error)
    assert len(sends) == 1  # the second try; the first was written at dispatch
    assert waited < 10


def test_flush_returns_once_every_batch_written_at_dispatch_is_settled(file_broker, monkeypatch):
    topic = create_topic(file_broker, "now-flush", 4)
    sends = _count_task_path_sends(monkeypatch)
    proxy = CuttableProxy(file_broker.port, answer_delay=0.05)  # answers come well after the writes
    try:
        with Producer(proxy.address, max_batch_bytes=1024) as p:
            p.send(Message(topic, b"warm"))
            futures = [p.send_async(Message(topic, f"f{i}".encode())) for i in range(200)]
            p.flush()
            assert all(f.done() for f in futures)
            assert all(f.exception(0) is None for f in futures)
    finally:
        proxy.close()
    assert sends == []
