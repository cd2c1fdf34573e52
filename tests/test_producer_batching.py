"""send_async batches leave as soon as their queue has nothing in flight; the linger only bounds
how long a batch waits for an earlier batch of its queue to be answered."""

from __future__ import annotations

from equeue_core.client import Message, Producer


def test_a_lone_send_async_does_not_wait_out_the_linger(file_broker):
    with Producer(file_broker.address, linger_ms=60_000) as p:
        p.send(Message("lone", b"warm-up"))
        for i in range(5):
            assert p.send_async(Message("lone", f"m{i}".encode())).result(timeout=10).topic == "lone"


def test_a_burst_leaves_batch_after_batch_as_answers_come_not_after_the_linger(file_broker):
    with Producer(file_broker.address, linger_ms=60_000) as p:
        p.send(Message("burst", b"warm-up"))
        futures = [p.send_async(Message("burst", b"x" * 100), routing_key="one-queue") for _ in range(3000)]
        results = [f.result(timeout=30) for f in futures]
    offsets = [r.queue_offset for r in results]
    assert offsets == sorted(offsets) and len(set(offsets)) == 3000
