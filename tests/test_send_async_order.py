"""`send_async` keeps one queue's order: one thread's messages to a one-queue topic are answered
and stored in the order sent, whatever mix of plain and other messages (keys, properties, str
bodies, tags) and however often batches fill. A batch a caller fills is sealed
(AsyncProducer._sealed) and leaves before any batch of its key opened after it. Also with the
pure-Python record functions.

Under load a plain message joins its topic's open batch in one frame (AsyncProducer._join_open),
without `_enqueue`: the join must be taken, and must keep the order and max_in_flight as
`_enqueue` does."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

from equeue_core.client import Message, Producer
from equeue_core.client import producer as producer_module
from tests.helpers.broker import create_topic
from tests.helpers.consume import stored_bodies

ROOT = Path(__file__).resolve().parent.parent


def _mixed_body(i: int) -> bytes:
    """Body of message i of the mixed stream (its index first, sizes 60-109 bytes)."""
    return f"{i:06d}".encode().ljust(60 + i % 50, b".")


def _mixed(i: int, topic: str) -> Message:
    """Message i of a stream where every few messages cannot take the join (keys, properties, a
    str body) and some carry a tag (which the join does take)."""
    body = _mixed_body(i)
    kind = i % 11
    if kind == 3:
        return Message(topic, body, keys=(f"k{i}",))
    if kind == 5:
        return Message(topic, body, properties={"n": str(i)})
    if kind == 7:
        return Message(topic, body.decode())
    return Message(topic, body, tag="t" if kind == 9 else None)


def send_mixed(address: str, topic: str, count: int, max_batch_bytes: int) -> list[bytes]:
    """Send `count` mixed messages with send_async from one thread; returns the bodies in send
    order after every future is answered in order of its queue offset. (Also run as a script by
    the pure-Python test below.)"""
    with Producer(address, max_batch_bytes=max_batch_bytes) as p:
        futures = [p.send_async(_mixed(i, topic)) for i in range(count)]
        offsets = [f.result(60).queue_offset for f in futures]
    inversions = [i for i in range(1, count) if offsets[i] < offsets[i - 1]]
    assert not inversions and len(set(offsets)) == count, f"stored out of send order at {inversions[:5]}"
    return [_mixed_body(i) for i in range(count)]


def test_a_mix_of_messages_is_stored_in_send_order(file_broker):
    """One queue, small batches (each fills after a few dozen records and is sealed), every
    eleventh message keyed, with properties or a str body: answered and stored exactly in the
    order sent. Several rounds, each from an idle
    producer: a batch opened after a full one once left before it about every other round
    (the loop thread sent the open batch on an answer or a linger check while the full one's
    dispatch still waited in the loop's queue); the sealed batches (`_sealed`) keep the order."""
    for round_ in range(10):
        topic = create_topic(file_broker, f"join-mixed-{round_}", 1)
        sent = send_mixed(file_broker.address, topic, 3000, max_batch_bytes=4096)
    assert stored_bodies(file_broker.address, topic, len(sent)) == sent


def test_at_the_default_batch_size_a_burst_of_1_kib_messages_keeps_its_order(file_broker):
    """The defaults (512 KiB batches): 60000 send_async of 1 KiB from an idle producer fill a
    batch every ~500 messages. Before batches were sealed, every run of this had a dozen or more
    messages answered (and stored) before earlier ones."""
    topic = create_topic(file_broker, "order-default", 1)
    body = os.urandom(1024)
    with Producer(file_broker.address) as p:
        futures = [p.send_async(Message(topic, body)) for _ in range(60000)]
        offsets = [f.result(60).queue_offset for f in futures]
    inversions = [i for i in range(1, len(offsets)) if offsets[i] < offsets[i - 1]]
    assert inversions == [], f"{len(inversions)} messages stored before earlier ones, first at {inversions[:5]}"
    assert offsets == list(range(60000))


def test_under_load_plain_messages_join_the_open_batch_without_enqueue(file_broker, monkeypatch):
    """Most messages of a burst join the batch that is open (fails if the join is never taken),
    and the stored order is the send order."""
    topic = create_topic(file_broker, "join-plain", 1)
    calls = []
    general = producer_module.AsyncProducer._enqueue

    def counted(self, *args, **kwargs):
        calls.append(1)
        return general(self, *args, **kwargs)

    monkeypatch.setattr(producer_module.AsyncProducer, "_enqueue", counted)
    sent = [f"{i:06d}".encode() for i in range(20000)]
    with Producer(file_broker.address) as p:
        futures = [p.send_async(Message(topic, body)) for body in sent]
        results = [f.result(60) for f in futures]
    # a message that opens a batch takes _enqueue; on a loaded machine batches are smaller
    assert len(calls) < len(sent) // 2, f"{len(calls)} of {len(sent)} messages took _enqueue"
    assert [r.queue_offset for r in results] == list(range(len(sent)))
    assert stored_bodies(file_broker.address, topic, len(sent)) == sent


def test_the_join_keeps_max_in_flight(file_broker):
    """No send_async returns with more than max_in_flight messages unanswered."""
    topic = create_topic(file_broker, "join-room", 2)
    most = 0
    with Producer(file_broker.address, max_in_flight=64) as p:
        futures = []
        for i in range(5000):
            futures.append(p.send_async(Message(topic, f"{i}".encode())))
            most = max(most, p._async._pending)
        for f in futures:
            f.result(60)
    assert 0 < most <= 64
    assert len(stored_bodies(file_broker.address, topic, 5000)) == 5000


def test_threads_topics_and_routing_keys_keep_each_senders_order_per_queue(file_broker):
    """Four threads share a producer with small batches and at most 2 frames out (so batches
    fill, are sealed, wait for room and leave on answers and linger checks) over three topics;
    some messages carry a routing key (pinned to one queue), sizes vary, and each round starts
    from an idle producer (the lane). For every thread, queue and stream (a routing key's
    messages are one stream, those without a key another: the two are not ordered against each
    other), its messages get rising offsets in the order it sent them, and every message is
    stored once."""
    topics = [create_topic(file_broker, f"order-mix-{i}", q) for i, q in enumerate((1, 2, 3))]
    errors: list[BaseException] = []
    per_thread: dict[int, list[tuple[str, int, bool, int]]] = {t: [] for t in range(4)}
    with Producer(file_broker.address, max_batch_bytes=8192, max_batches_in_flight=2) as p:
        def sender(t: int) -> None:
            rng = random.Random(t)
            try:
                for _ in range(3):
                    futures, keyed = [], []
                    for i in range(1500):
                        topic = topics[rng.randrange(3)]
                        body = f"{t}-{i}".encode().ljust(rng.choice((20, 200, 900, 3000)), b".")
                        key = f"k{t}" if rng.random() < 0.3 else None
                        futures.append(p.send_async(Message(topic, body), routing_key=key))
                        keyed.append(key is not None)
                    per_thread[t] += [(r.topic, r.queue_id, k, r.queue_offset)
                                      for r, k in zip((f.result(60) for f in futures), keyed, strict=True)]
                    p.flush()
            except BaseException as e:  # reported below, not lost in the thread
                errors.append(e)

        threads = [threading.Thread(target=sender, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(180)
    assert not errors, errors[:3]
    seen = set()
    for t, results in per_thread.items():
        assert len(results) == 4500
        last: dict[tuple[str, int, bool], int] = {}
        for topic, queue_id, keyed, offset in results:
            where = (topic, queue_id, keyed)
            assert offset > last.get(where, -1), f"thread {t}: {where} offset {offset} after {last[where]}"
            last[where] = offset
            seen.add((topic, queue_id, offset))
    assert len(seen) == 4 * 4500


def test_the_order_with_the_pure_python_record_functions(file_broker):
    """EQUEUE_PURE_PYTHON=1 (no compiled hot path): the same mix, three rounds into one topic,
    the same order."""
    topic = create_topic(file_broker, "join-pure", 1)
    code = ("import sys; from tests.test_send_async_order import send_mixed; "
            "from equeue_core import record; assert record.IMPLEMENTATION == 'python', record.IMPLEMENTATION; "
            f"[send_mixed({file_broker.address!r}, {topic!r}, 3000, 4096) for _ in range(3)]; print('sent')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "EQUEUE_PURE_PYTHON": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["sent"]
    expected = [_mixed_body(i) for i in range(3000)]
    assert stored_bodies(file_broker.address, topic, 9000) == expected * 3
