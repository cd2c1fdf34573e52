"""The thread lane of `send_async` (AsyncProducer.send_on_lane): a producer with nothing
unanswered writes a plain message's frame from the caller's thread on a connection of its own,
with no hop through the client's loop thread. What it must keep: every message stored once its
future says so, a queue's messages stored in the order they were sent (what gathers behind the
lane's frame never overtakes it), batching under load, and at least once when the lane's
connection breaks or its broker stops answering."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from equeue_core.client import Message, Producer
from equeue_core.client.producer import LANE_DEPTH, LANE_SPARSE_DEPTH, LANE_SPARSE_GAP_S
from equeue_core.errors import TransportError
from tests.helpers.broker import BrokerProcess, create_topic
from tests.helpers.consume import stored_bodies


def test_a_sparse_sender_goes_on_the_lane_and_every_message_is_stored(file_broker):
    topic = create_topic(file_broker, "lane-sparse", 4)
    with Producer(file_broker.address) as p:
        results = []
        for i in range(200):
            results.append(p.send_async(Message(topic, f"m{i}".encode())).result(30))
        lane_frames = p.lane_frames
    # the lane opens with the first frame, in the background: the first few go the loop path
    assert lane_frames >= 150, f"only {lane_frames} of 200 idle sends went on the lane"
    assert len({(r.queue_id, r.queue_offset) for r in results}) == 200
    assert len({r.msg_id for r in results}) == 200
    assert sorted(stored_bodies(file_broker.address, topic, 200)) == sorted(f"m{i}".encode() for i in range(200))


def test_what_gathers_behind_the_lane_frame_is_stored_after_it(file_broker):
    """One queue, so every frame goes to it: a lone send (the lane) then at once a burst (which
    gathers while the lane's frame is out, full batches among it): stored in send order."""
    topic = create_topic(file_broker, "lane-order", 1)
    sent = []
    with Producer(file_broker.address, max_batch_bytes=2048) as p:
        futures = []
        for round_ in range(60):
            p.flush()  # nothing unanswered: the next send_async takes the lane
            for j in range(1 + round_ % 7 * 10):
                body = f"{round_}-{j}".encode().ljust(100, b".")
                sent.append(body)
                futures.append(p.send_async(Message(topic, body)))
        results = [f.result(30) for f in futures]
        lane_frames = p.lane_frames
    assert lane_frames >= 50
    assert [r.queue_offset for r in results] == sorted(r.queue_offset for r in results)
    assert len({r.queue_offset for r in results}) == len(sent)
    assert stored_bodies(file_broker.address, topic, len(sent)) == sent


def test_threads_sharing_a_producer_each_keep_their_order(file_broker):
    """Four threads share one producer and a one-queue topic. Each round starts with the producer
    idle (a barrier after every thread waited for its results), so the threads' first messages
    race for the lane's slots and the rest gather behind them: every message is stored once, and
    each thread's messages in the order that thread sent them."""
    topic = create_topic(file_broker, "lane-threads", 1)
    errors: list[BaseException] = []
    rounds, burst = 12, 10
    barrier = threading.Barrier(4)
    with Producer(file_broker.address) as p:
        p.send_async(Message(topic, b"opens-the-lane")).result(30)

        def sender(t: int) -> None:
            try:
                for r in range(rounds):
                    barrier.wait(30)
                    futures = [p.send_async(Message(topic, f"{t}-{r * burst + i}".encode())) for i in range(burst)]
                    for f in futures:
                        f.result(30)
                    barrier.wait(30)
            except BaseException as e:  # reported below, not lost in the thread
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        lane_frames = p.lane_frames
    assert not errors, errors[:3]
    assert lane_frames > rounds  # at least the first message of each round took the lane
    total = 4 * rounds * burst
    stored = [b for b in stored_bodies(file_broker.address, topic, total + 1) if b != b"opens-the-lane"]
    assert len(stored) == total and len(set(stored)) == total
    for t in range(4):
        mine = [int(b.split(b"-")[1]) for b in stored if b.startswith(f"{t}-".encode())]
        assert mine == list(range(rounds * burst)), f"thread {t}: {mine[:20]}"


def test_a_large_message_goes_the_loop_path_and_the_lane_stays_up(file_broker):
    topic = create_topic(file_broker, "lane-large", 4)
    big = os.urandom(3 * 1024 * 1024)
    with Producer(file_broker.address) as p:
        p.send_async(Message(topic, b"small")).result(30)
        before = p.lane_frames
        assert p.send_async(Message(topic, big)).result(60).topic == topic
        assert p.lane_frames == before  # not on the lane
        for i in range(20):
            p.send_async(Message(topic, f"s{i}".encode())).result(30)
        assert p.lane_frames >= before + 19
    bodies = stored_bodies(file_broker.address, topic, 22)
    assert big in bodies and len(bodies) == 22


@pytest.mark.parametrize("behind_count", [0, 6])
def test_close_waits_for_the_frames_on_the_lane_and_what_gathered_behind_them(tmp_path, behind_count):
    """close() (its flush) waits until the lane's frames are answered, then sends what gathered
    behind them. The broker is stopped (SIGSTOP) while the lane's frames and a batch behind them
    are out, close() starts, and the broker goes on 0.3 s later: all are stored, in order."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        topic = create_topic(b, "lane-close", 1)
        p = Producer(b.address, send_timeout=10).start()
        closed = threading.Event()
        try:
            p.send_async(Message(topic, b"first")).result(30)  # the lane is open from here on
            time.sleep(0.01)  # answered and booked: the producer is idle
            lane_before = p.lane_frames
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                on_lane = p.send_async(Message(topic, b"on-lane"))
                behind = [p.send_async(Message(topic, f"behind-{i}".encode())) for i in range(behind_count)]
                closer = threading.Thread(target=lambda: (p.close(), closed.set()))
                closer.start()
                time.sleep(0.3)
                assert not closed.is_set(), "close() returned with the lane's frame unanswered"
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            closer.join(30)
            assert closed.is_set()
        finally:
            p.close()
        assert on_lane.result(0).topic == topic
        # back to back, so after LANE_DEPTH the rest gathered behind (a sender that paused for
        # LANE_SPARSE_GAP_S between two of them, preempted, may have put one more on the lane)
        on_the_lane = p.lane_frames - lane_before
        assert min(1 + behind_count, LANE_DEPTH) <= on_the_lane <= 1 + behind_count
        offsets = [on_lane.result(0).queue_offset] + [f.result(0).queue_offset for f in behind]
        assert offsets == sorted(offsets)
        assert stored_bodies(b.address, topic, 2 + behind_count) == \
            [b"first", b"on-lane"] + [f"behind-{i}".encode() for i in range(behind_count)]
    finally:
        b.stop()


def test_a_sparse_sender_keeps_to_the_lane_while_its_broker_does_not_answer(tmp_path):
    """A paced sender whose broker stalls for a moment: messages a few ms apart keep going on the
    lane past LANE_DEPTH unanswered (up to LANE_SPARSE_DEPTH) instead of gathering behind it, and
    back-to-back ones after them still gather (the lane stops at LANE_SPARSE_DEPTH either way).
    Everything is stored once, in send order, when the broker goes on."""
    spaced = 12
    assert LANE_DEPTH < spaced < LANE_SPARSE_DEPTH and LANE_SPARSE_GAP_S < 0.004
    b = BrokerProcess(tmp_path / "data").start()
    try:
        topic = create_topic(b, "lane-sparse-stall", 1)
        with Producer(b.address, send_timeout=10) as p:
            p.send_async(Message(topic, b"first")).result(30)  # the lane is open from here on
            time.sleep(0.01)  # answered and booked: the producer is idle
            lane_before = p.lane_frames
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                futures = []
                for i in range(spaced):
                    time.sleep(0.005)
                    futures.append(p.send_async(Message(topic, f"spaced-{i}".encode())))
                futures += [p.send_async(Message(topic, f"burst-{i}".encode())) for i in range(2 * LANE_SPARSE_DEPTH)]
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            results = [f.result(30) for f in futures]
            on_the_lane = p.lane_frames - lane_before  # (counted as the lane's answers come)
        assert spaced <= on_the_lane <= LANE_SPARSE_DEPTH  # LANE_DEPTH only, without the sparse rule
        assert [r.queue_offset for r in results] == sorted(r.queue_offset for r in results)
        assert stored_bodies(b.address, topic, 1 + len(futures)) == [b"first"] + \
            [f"spaced-{i}".encode() for i in range(spaced)] + [f"burst-{i}".encode() for i in range(2 * LANE_SPARSE_DEPTH)]
    finally:
        b.stop()


def test_under_load_messages_are_batched_not_sent_one_by_one(file_broker):
    topic = create_topic(file_broker, "lane-load", 4)
    with Producer(file_broker.address) as p:
        p.send(Message(topic, b"warm-up"))
        futures = [p.send_async(Message(topic, b"x" * 100)) for _ in range(20000)]
        for f in futures:
            f.result(60)
        lane_frames = p.lane_frames
    # the lane carries a message only when the producer had nothing unanswered
    assert lane_frames < 1000


def test_a_broker_killed_and_restarted_loses_no_acknowledged_message(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        topic = create_topic(b, "lane-restart", 4)
        acknowledged: list[bytes] = []
        failed = 0
        with Producer(b.address, retries=2, send_timeout=5) as p:
            for i in range(40):
                body = f"before-{i}".encode()
                p.send_async(Message(topic, body)).result(30)
                acknowledged.append(body)
            lane_at_kill = p.lane_frames
            assert lane_at_kill >= 20
            b.kill()
            b.start()
            deadline = time.monotonic() + 60
            i = 0
            while (len(acknowledged) < 80 or p.lane_frames - lane_at_kill < 20) and time.monotonic() < deadline:
                body = f"after-{i}".encode()
                i += 1
                try:
                    p.send_async(Message(topic, body)).result(30)
                    acknowledged.append(body)
                except TransportError:
                    failed += 1  # the send's error after its retries: the caller knows
                    time.sleep(0.05)
            lane_after = p.lane_frames
        assert len(acknowledged) >= 80
        assert lane_after - lane_at_kill >= 20, "the lane did not reconnect after the restart"
        stored = set(stored_bodies(b.address, topic, len(acknowledged)))
        missing = [x for x in acknowledged if x not in stored]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
    finally:
        b.stop()


def test_a_lane_frame_the_broker_does_not_answer_is_retried_and_then_fails(tmp_path):
    """The broker is stopped (SIGSTOP) with the lane's frame unanswered: after send_timeout the
    frame is retried on the main connection, and after the retries the future fails with a
    TransportError (never hangs, never reports success). Once the broker runs again the message
    may be stored (at least once) and later sends succeed."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        topic = create_topic(b, "lane-stopped", 4)
        with Producer(b.address, retries=1, send_timeout=1.0) as p:
            p.send_async(Message(topic, b"first")).result(30)
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                future = p.send_async(Message(topic, b"unanswered"))
                error = future.exception(30)
                waited = time.monotonic() - started
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            assert isinstance(error, TransportError), error
            assert waited < 20
            assert p.send_async(Message(topic, b"after")).result(30).topic == topic
    finally:
        b.stop()


def test_a_producer_keeps_its_attributes_within_cpythons_shared_key_limit():
    """CPython 3.11 keeps an instance's attributes in a shared-key dict only while it has fewer
    than 30 of them; past that every attribute read of the send_async hot path is slower (_enqueue
    +7 %, docs/benchmarks.md). New state goes into an object of its own (as _ThreadLane)."""
    from equeue_core.client.producer import AsyncProducer

    p = AsyncProducer("127.0.0.1:1")
    p._lane = object()  # type: ignore[assignment]  # what a blocking Producer sets
    assert len(vars(p)) <= 29, sorted(vars(p))
