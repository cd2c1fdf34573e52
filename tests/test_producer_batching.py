"""send_async batches leave as soon as their queue has nothing in flight; the linger only bounds
how long a batch waits for an earlier batch of its queue to be answered."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from equeue_core.client import Message, Producer
from tests.helpers.broker import BrokerProcess
from tests.helpers.waiting import wait_until


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


def test_a_batch_waiting_behind_an_unanswered_one_still_leaves_after_the_linger(tmp_path):
    """The linger bounds how long a batch waits for an earlier batch of its queue to be answered,
    also now that opening it does not wake the loop thread (the loop checks every linger while a
    batch of the queue is in flight): with the broker frozen, the second batch is written after
    ~linger, not held until the first answer; both are stored once the broker runs again."""
    import time

    b = BrokerProcess(tmp_path / "data").start()
    try:
        with Producer(b.address, linger_ms=50) as p:
            p.send(Message("frozen", b"warm-up"), routing_key="k")
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                first = p.send_async(Message("frozen", b"first"), routing_key="k")
                assert wait_until(lambda: len(p._async._in_flight) == 1, timeout=10)
                key = next(iter(p._async._in_flight))  # the first batch is in flight, unanswered
                time.sleep(0.2)
                second = p.send_async(Message("frozen", b"second"), routing_key="k")
                assert wait_until(lambda: p._async._in_flight.get(key) == 2, timeout=10)
                assert key not in p._async._open and not first.done()
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            assert second.result(30).queue_offset == first.result(30).queue_offset + 1
    finally:
        b.stop()


def test_send_async_blocks_at_max_in_flight_and_says_the_broker_is_busy_when_no_answer_frees_room(tmp_path):
    """Bounded memory: with the broker frozen, at most max_in_flight messages wait for answers; the
    next send_async waits up to send_timeout for room, then raises BrokerBusyError. Once the
    broker runs again every accepted message is acknowledged."""
    from equeue_core.errors import BrokerBusyError

    b = BrokerProcess(tmp_path / "data").start()
    try:
        # retries=2: an unanswered batch holds its room for 3 tries of send_timeout, well past the
        # one send_timeout the blocked caller waits
        with Producer(b.address, max_in_flight=40, send_timeout=1.0, retries=2) as p:
            p.send(Message("busy", b"warm-up"))
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                accepted = [p.send_async(Message("busy", b"m")) for _ in range(40)]
                assert p._async._pending == 40
                with pytest.raises(BrokerBusyError):
                    p.send_async(Message("busy", b"one too many"))
                assert p._async._pending == 40
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            outcomes = []
            for f in accepted:  # answered, or timed out while the broker was frozen (at least once)
                outcomes.append(f.exception(30))
            assert all(e is None or e.code == "timeout" for e in outcomes), outcomes
        assert p._async._pending == 0
    finally:
        b.stop()


def test_callers_waiting_for_room_are_woken_by_each_answer_not_by_the_timeout(file_broker):
    """max_in_flight far below the burst, from two threads: every send_async gets room as answers
    free it (a missed wake-up would leave a caller waiting out send_timeout, then BrokerBusyError)."""
    errors: list[BaseException] = []
    results: list[list] = [[], []]
    with Producer(file_broker.address, max_in_flight=30, send_timeout=20.0) as p:
        p.send(Message("room", b"warm-up"))

        def burst(n: int) -> None:
            try:
                futures = [p.send_async(Message("room", f"{n}-{i}".encode()), routing_key=str(n))
                           for i in range(3000)]
                results[n] = [f.result(60) for f in futures]
            except BaseException as e:  # noqa: BLE001 -- reported by the assertion below
                errors.append(e)

        threads = [threading.Thread(target=burst, args=(n,)) for n in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert p._async._pending == 0
    assert errors == []
    for rs in results:  # per key (one queue each) in the order sent
        assert len(rs) == 3000 and [r.queue_offset for r in rs] == sorted(r.queue_offset for r in rs)


def _sends_served(address: str) -> int:
    from equeue_core.client import AdminClient

    with AdminClient(address) as admin:
        return sum(admin.stats()["latency"]["send"]["counts"])


@contextmanager
def _warm_producer(tmp_path, topics: list[str], **options) -> Iterator[tuple[BrokerProcess, Producer]]:
    """A broker process, and a Producer on it that sent to every topic once (routes known)."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with Producer(b.address, **options) as p:
            for t in topics:
                p.send(Message(t, b"warm-up"))
            yield b, p
    finally:
        b.stop()


def test_round_robin_over_many_topics_fills_frames_instead_of_a_frame_per_topic_per_round_trip(tmp_path):
    """send_async over 20 topics while the broker cannot answer: at most max_batches_in_flight
    frames go out; the other topics' messages gather in their open batches and leave, one frame
    per topic, as answers free room. Without that limit every topic had a frame in flight and
    each linger check sent another small one per topic (the 100-topic produce ran at a quarter
    of the one-topic rate). Every message is stored, in order per topic."""
    topics = [f"rr{i}" for i in range(20)]
    with _warm_producer(tmp_path, topics, max_batches_in_flight=4) as (b, p):
        before = _sends_served(b.address)
        with b.frozen():
            futures = [p.send_async(Message(topics[i % 20], f"{i}".encode())) for i in range(2000)]
            # the linger checks of the frozen frames' topics come and go meanwhile
            assert wait_until(lambda: len(p._async._deferred) >= 16, timeout=10)
            assert p._async._frames == 4
        results = [f.result(30) for f in futures]
        served = _sends_served(b.address) - before
    assert served <= 4 + 20 + 4, served  # the frozen 4, one per topic, the frozen topics' next
    for t in topics:
        mine = [r for r in results if r.topic == t]
        assert len(mine) == 100
        for q in {r.queue_id for r in mine}:  # per queue, in the order sent
            offsets = [r.queue_offset for r in mine if r.queue_id == q]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


def test_a_caller_waiting_on_a_gathering_batch_sends_every_gathering_batch_at_once(tmp_path):
    """The frame limit makes batches gather while frames are out; a caller that waits on one of
    them sends nothing more meanwhile, so its wait at the limit sends every gathering batch at once
    (past the limit) instead of leaving them to go one answer at a time (behind a broker that answers in
    5 ms, 2000 send_async over 100 topics took 173 ms to be answered, 50 ms now)."""
    topics = [f"w{i}" for i in range(10)]
    with _warm_producer(tmp_path, topics, max_batches_in_flight=2) as (b, p):
        results: list = []
        with b.frozen():
            futures = [p.send_async(Message(t, b"%d" % i)) for i in range(100) for t in topics]
            assert wait_until(lambda: len(p._async._deferred) >= 8, timeout=10), (
                p._async._deferred, p._async._frames, p._async._lane and p._async._lane.out)
            assert p._async._frames == 2  # the limit holds while nobody waits
            waiter = threading.Thread(target=lambda: results.append(futures[-1].result(30)))
            waiter.start()
            # the broker is still frozen: the wait alone sent every gathering batch (the other
            # eight topics', and the next ones of the two topics with a frame out), all ten in
            # one SEND_MULTI frame (client/send_multi.py)
            assert wait_until(lambda: p._async._frames == 3 and not p._async._open, timeout=10), (
                p._async._frames, len(p._async._open))
            assert p.multi_frames == 1
        waiter.join(40)
        assert not waiter.is_alive()
        assert [f.result(30).topic for f in futures] == topics * 100 and results[0].topic == topics[-1]


def test_below_the_frame_limit_callers_waiting_on_their_messages_still_share_a_frame(tmp_path):
    """Many callers each waiting on their own message (threads, coroutines) must keep batching:
    below max_batches_in_flight nothing but a queue's own frame in flight holds a batch back, so
    a wait sends nothing early. One topic, the broker frozen with one frame out, a linger far
    longer than the test: the next 20 messages gather while a caller waits on the last one, and
    leave as one frame once the first is answered."""
    import asyncio

    with _warm_producer(tmp_path, ["share"], linger_ms=60_000) as (b, p):
        before = _sends_served(b.address)
        results: list = []
        with b.frozen():
            first = p.send_async(Message("share", b"first"), routing_key="k")
            assert wait_until(lambda: p._async._frames == 1, timeout=10)
            futures = [p.send_async(Message("share", b"%d" % i), routing_key="k") for i in range(20)]
            waiter = threading.Thread(target=lambda: results.append(futures[-1].result(30)))
            waiter.start()
            batch = futures[-1]._batch
            assert wait_until(lambda: batch._future is not None, timeout=10)  # the caller waits
            loop = p._async._loop
            for _ in range(2):  # anything the wait scheduled on the loop has run by now
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(10)
            assert p._async._frames == 1 and p._async._open, "a wait below the limit sent a frame early"
        waiter.join(40)
        assert not waiter.is_alive() and first.result(30).topic == "share"
        offsets = [f.result(30).queue_offset for f in futures]
        assert offsets == sorted(offsets) and results[0].queue_offset == offsets[-1]
        assert _sends_served(b.address) - before == 2  # the first frame, then the 20 in one
