"""Orderly consumption keeps per-queue order when a lock changes hands or a handler fails: a
consumer whose connection drops (the broker releases its locks at once) stops handling before the
next lock holder starts, and a failing batch stops the batches behind it."""

from __future__ import annotations

import threading
import time

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.codes import Code
from tests.helpers.broker import BrokerProcess
from tests.helpers.proxy import CuttableProxy
from tests.helpers.waiting import wait_until

FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1)


@pytest.fixture
def long_lock_broker(tmp_path):
    """Locks expire after 10 minutes: a lock can only move because its holder's connection closed."""
    cfg = tmp_path / "broker.toml"
    cfg.write_text("heartbeat_expiry_s = 600\nqueue_lock_expiry_s = 600\noffset_persist_ms = 200\n")
    with BrokerProcess(tmp_path / "data", config=str(cfg)) as b:
        yield b


def test_a_consumer_whose_connection_drops_stops_before_the_next_lock_holder_starts(long_lock_broker):
    b = long_lock_broker
    total = 400
    with AdminClient(b.address) as admin:
        admin.create_topic("ordq", 1)
    with Producer(b.address) as p:
        p.send_batch([Message("ordq", f"{i}".encode()) for i in range(total)])
    calls: list[tuple[str, int, float]] = []  # (consumer, queue offset, start time)
    lock = threading.Lock()

    def handler_for(name: str):
        def handler(m):
            with lock:
                calls.append((name, m.queue_offset, time.monotonic()))
            time.sleep(0.01)
        return handler

    proxy = CuttableProxy(b.port)
    a = Consumer("gord", proxy.address, orderly=True, consume_from="first", **FAST).subscribe("ordq")
    second = None
    try:
        a.start(handler_for("A"))
        # A has pulled far ahead of what it handled when its connection goes
        assert wait_until(lambda: len(calls) >= 30, 30)
        proxy.cut()
        second = Consumer("gord", b.address, orderly=True, consume_from="first", **FAST).subscribe("ordq")
        second.start(handler_for("B"))
        # B handles in order, so once it reached the last offset it handled everything after A
        assert wait_until(lambda: any(n == "B" and o == total - 1 for n, o, _ in calls), 60), \
            f"B handled {sum(1 for n, *_ in calls if n == 'B')} messages"
    finally:
        proxy.close()
        a.close()
        if second is not None:
            second.close()
    a_calls = [(o, t) for n, o, t in calls if n == "A"]
    b_calls = [(o, t) for n, o, t in calls if n == "B"]
    b_first = b_calls[0][1]
    late = [o for o, t in a_calls if t >= b_first]
    assert not late, f"A kept handling {len(late)} messages after B took the queue (offsets {late[:5]}...)"
    for offs in ([o for o, _ in a_calls], [o for o, _ in b_calls]):
        assert offs == sorted(offs) and len(set(offs)) == len(offs), "per-queue order broken"
    a_last = a_calls[-1][0]
    assert b_calls[0][0] <= a_last + 1, f"B skipped from {a_last} to {b_calls[0][0]}"
    assert {o for o, _ in a_calls} | {o for o, _ in b_calls} == set(range(total))


def test_a_failing_batch_stops_the_batches_behind_it_in_orderly_mode(long_lock_broker):
    b = long_lock_broker
    total = 60
    with AdminClient(b.address) as admin:
        admin.create_topic("ordb", 1)
    with Producer(b.address) as p:
        p.send_batch([Message("ordb", f"{i}".encode()) for i in range(total)])
    handled: list[int] = []  # offsets of batches that returned normally, in call order
    failed_once = threading.Event()
    done = threading.Event()

    def batch_handler(msgs):
        offs = [m.queue_offset for m in msgs]
        if 10 in offs and not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("batch with offset 10 fails once")
        handled.extend(offs)
        if set(handled) >= set(range(total)):
            done.set()

    c = Consumer("gordb", b.address, orderly=True, consume_from="first", consume_batch_size=4,
                 **FAST).subscribe("ordb")
    c.start(batch_handler)
    try:
        assert done.wait(30), f"handled {sorted(set(handled))}"
    finally:
        c.close()
    assert failed_once.is_set()
    assert handled == list(range(total)), f"order broken around the failed batch: {handled[:24]}"


@pytest.mark.parametrize("expression", ["*", "a"])
def test_an_orderly_consumer_decodes_a_pulled_answer_a_part_at_a_time(tmp_path, expression):
    """1000 messages in one queue (every other one tagged "a") come in answers of up to 500, yet
    at most DECODE_AT_MOST (256) of them exist as message objects at once (pending and in flight
    one by one): a whole answer decoded at the pull cost an orderly drain ~500 collections. All
    (with the filter "a": all tagged "a") are handled once, in order, and the committed offset
    ends past the last."""
    total = 1000
    topic = f"ordparts-{'all' if expression == '*' else 'a'}"
    wanted = list(range(total)) if expression == "*" else list(range(0, total, 2))
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic(topic, 1)
        with Producer(b.address) as p:
            p.send_batch([Message(topic, f"{i}".encode(), tag="ab"[i % 2]) for i in range(total)])
        seen: list[int] = []
        most = [0, 0]  # pending, in flight one by one
        group = f"g{topic}"
        c = Consumer(group, b.address, orderly=True, consume_from="first", **FAST).subscribe(topic, expression)

        def handler(m):
            pq = c._async.queues[(topic, 0)]
            most[0] = max(most[0], len(pq.pending))
            most[1] = max(most[1], len(pq.in_flight))
            seen.append(m.queue_offset)

        try:
            c.start(handler)
            assert wait_until(lambda: len(seen) >= len(wanted), 30)
            assert wait_until(lambda: c._async.queues[(topic, 0)].committable() == total, 10)
            peak = c.stats["pull_batch_peak"]
        finally:
            c.close()
        with AdminClient(b.address) as admin:
            committed = admin.request(Code.QUERY_OFFSET, {"group": group, "topic": topic, "queue_id": 0})["offset"]
    assert seen == wanted
    assert peak >= 500, "the answers were no larger than a part: the test would show nothing"
    assert 0 < most[0] <= 256 and most[1] <= 256, most
    assert committed == total
