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


def test_send_async_without_a_key_batches_as_well_on_1000_queues_and_still_spreads(file_broker):
    """Queue chosen per batch, not per message: a burst on a 1000-queue topic is a few frames
    (a queue each), not 1000 one-message frames; bursts one after another move on to new queues."""
    from equeue_core.client import AdminClient

    with AdminClient(file_broker.address) as admin:
        admin.create_topic("wide", 1000)
    used: list[set[int]] = []
    with Producer(file_broker.address, linger_ms=60_000) as p:
        for _ in range(5):
            futures = [p.send_async(Message("wide", b"z" * 100)) for _ in range(2000)]
            used.append({f.result(timeout=30).queue_id for f in futures})
    assert all(len(queues) <= 100 for queues in used), [len(q) for q in used]
    assert len(set().union(*used)) > 1
