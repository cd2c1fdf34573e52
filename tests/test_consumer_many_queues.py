"""A consumer given many queues at once (1000 queues of one topic, or 100 topics): taking them must
not cost a round trip per queue, and every queue must still start at its committed offset."""

from __future__ import annotations

import threading

from equeue_core.client import AdminClient, Consumer, Message, Producer
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import Collector, consume

QUEUES = 200


def test_a_consumer_taking_many_queues_asks_their_start_offsets_pipelined_and_starts_each_at_its_commit(tmp_path):
    """Before: one QUERY_OFFSET round trip per assigned queue, one after another (at most one in
    flight: 1000 queues took ~0.5 s before the first pull of the last queue). Now they are asked
    in windows; the offsets still land on the right queues: a second consumer of the group gets
    exactly the messages sent after the first one committed."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with AdminClient(b.address) as admin:
            admin.create_topic("many", QUEUES)
        with Producer(b.address) as p:
            p.send_batch([Message("many", f"old{i}".encode()) for i in range(QUEUES)], routing_key=None)
        first = consume(b.address, "g", "many", QUEUES, timeout=60)
        assert len(first.items) == QUEUES
        with Producer(b.address) as p:
            for i in range(60):  # spread over many queues by routing key
                p.send(Message("many", f"new{i}".encode()), routing_key=f"k{i}")

        in_flight = 0
        peak = 0
        lock = threading.Lock()
        col = Collector(60)
        c = Consumer("g", b.address, consume_from="first")
        real = c._async._start_point

        async def counted(topic: str, queue_id: int) -> tuple[int, int]:
            nonlocal in_flight, peak
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            try:
                return await real(topic, queue_id)
            finally:
                with lock:
                    in_flight -= 1

        c._async._start_point = counted
        c.subscribe("many")
        c.start(col)
        try:
            assert col.wait(60), f"got {len(col.items)} of 60"
            assert len(c.assigned_queues()) == QUEUES
        finally:
            c.close()
        bodies = sorted(body.decode() for _t, _q, _o, body in col.items)
        assert bodies == sorted(f"new{i}" for i in range(60)), "a queue started before its committed offset"
        assert peak > 1, "start offsets were asked one round trip at a time"
    finally:
        b.stop()
