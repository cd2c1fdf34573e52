"""A producer's batches without a routing key spread over their topic's queues by messages, not
by batches (client/queue_spread.py): each new batch goes to the queue this producer sent the
fewest messages to. Batches differ in size by a hundredfold under load, and round robin over
batches left some of 1000 queues with 2 messages and others with 1431."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from equeue_core.client import AdminClient, AsyncAdminClient, AsyncProducer, Message
from equeue_core.client.queue_spread import QueueSpread
from equeue_core.strategies.selectors import RoundRobin


@dataclass
class Batch:
    queue: int = -1
    count: int = 0


def run_batches(spread: QueueSpread, sizes: list[int]) -> dict[int, int]:
    """Open a batch per size, each after the one before has closed (as a topic's one open batch
    does); the messages each queue got."""
    got: dict[int, int] = {q: 0 for q in spread.queues}
    for n in sizes:
        b = Batch()
        b.queue = spread.queue_for_batch(b)
        b.count = n  # messages join while it is open; final before the next one opens
        got[b.queue] += n
    return got


def test_batches_of_one_size_go_round_robin():
    spread = QueueSpread([0, 1, 2])
    order = []
    for _ in range(7):
        b = Batch(count=10)
        b.queue = spread.queue_for_batch(b)
        order.append(b.queue)
    assert order == [0, 1, 2, 0, 1, 2, 0]


def test_small_and_large_batches_in_turn_even_out_where_round_robin_does_not():
    sizes = [1, 40] * 50
    got = run_batches(QueueSpread([0, 1]), sizes)
    assert sum(got.values()) == sum(sizes)
    assert abs(got[0] - got[1]) <= 40, got
    # what the round robin selector gave when it chose each batch's queue
    selector, by_rr = RoundRobin(), {0: 0, 1: 0}
    for n in sizes:
        by_rr[selector.select([0, 1], None)] += n
    assert by_rr == {0: 50, 1: 2000}


def test_queues_stay_within_one_batch_of_each_other_whatever_the_sizes():
    rng = random.Random(15)
    for queues in (2, 7, 100, 1000):
        largest = 500
        sizes = [rng.choice((1, 2, 5, rng.randint(1, largest))) for _ in range(queues * 3)]
        got = run_batches(QueueSpread(list(range(queues))), sizes)
        assert max(got.values()) - min(got.values()) <= largest, (queues, min(got.values()), max(got.values()))
        assert min(got.values()) > 0  # every queue got a batch: one with none always goes first


def test_one_queue_takes_every_batch():
    got = run_batches(QueueSpread([5]), [3, 1, 4])
    assert got == {5: 8}


def test_messages_sent_outside_the_batches_are_counted_at_once():
    spread = QueueSpread([0, 1])
    assert [spread.queue_for() for _ in range(4)] == [0, 1, 0, 1]
    assert spread.sent() == {0: 2, 1: 2}
    assert spread.queue_for(10) == 0 and spread.queue_for() == 1 and spread.queue_for() == 1
    assert spread.sent() == {0: 12, 1: 4}


def test_a_real_producer_evens_out_batches_of_different_sizes(file_broker):
    """Against a broker: groups of 1 and of 40 messages, each group one batch (sent together in
    one turn of the loop, then answered before the next). Round robin put every group of 1 in
    one queue and every group of 40 in the other (20 against 800 messages)."""
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("spread", 2)

    async def go() -> dict[int, int]:
        got = {0: 0, 1: 0}
        async with AsyncProducer(file_broker.address) as p:
            await p.send(Message("spread", b"warm-up"))
            for n in [1, 40] * 20:
                results = await asyncio.gather(*(p.send(Message("spread", b"x" * 50)) for _ in range(n)))
                assert len({r.queue_id for r in results}) == 1  # one batch: one queue
                got[results[0].queue_id] += n
        return got

    got = asyncio.run(go())
    assert sum(got.values()) == 820
    assert abs(got[0] - got[1]) <= 41, got


def test_a_route_refresh_keeps_the_spread_until_the_topic_has_more_queues(file_broker):
    """Another selector gets no spread: it chooses each batch's queue itself."""
    with AdminClient(file_broker.address) as admin:
        admin.create_topic("kept", 2)

    async def go() -> None:
        async with AsyncProducer(file_broker.address) as p:
            first = await p.route("kept")
            assert first.spread is not None
            again = await p.route("kept", refresh=True)
            assert again is not first and again.spread is first.spread
            for _ in range(3):
                await p.send(Message("kept", b"x"))
            assert sum(first.spread.sent().values()) == 2  # the last batch counts at the next
            admin = await AsyncAdminClient(file_broker.address).start()
            try:
                await admin.create_topic("kept", 4)
            finally:
                await admin.close()
            grown = await p.route("kept", refresh=True)
            assert grown.spread is not first.spread and grown.spread.sent() == {0: 0, 1: 0, 2: 0, 3: 0}
            queues = [(await p.send(Message("kept", b"y"))).queue_id for _ in range(4)]
            assert sorted(queues) == [0, 1, 2, 3]
        async with AsyncProducer(file_broker.address, selector="random") as p:
            assert (await p.route("kept")).spread is None  # the selector chooses each batch's queue

    asyncio.run(go())


def test_send_batch_calls_of_different_sizes_even_out(file_broker):
    """send_batch, direct (blocking Producer) and through the loop (AsyncProducer), counts its
    messages into the same spread: calls of 1 and 40 messages in turn over 2 queues end within
    one call of each other (the selector alone put every call of 1 in one queue and every call
    of 40 in the other)."""
    from equeue_core.client import Producer

    with AdminClient(file_broker.address) as admin:
        admin.create_topic("batches", 2)
    got = {0: 0, 1: 0}
    with Producer(file_broker.address) as p:
        for n in [1, 40] * 10:
            results = p.send_batch([Message("batches", b"x" * 50) for _ in range(n)])
            got[results[0].queue_id] += n
    assert abs(got[0] - got[1]) <= 40, got

    async def go() -> None:
        async with AsyncProducer(file_broker.address) as p:
            for n in [1, 40] * 10:
                results = await p.send_batch([Message("batches", b"y" * 50) for _ in range(n)])
                got[results[0].queue_id] += n

    got = {0: 0, 1: 0}
    asyncio.run(go())
    assert abs(got[0] - got[1]) <= 40, got
