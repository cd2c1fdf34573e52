"""The broker end to end: a real broker process, real files, real sockets, on every store and transport."""

from __future__ import annotations

import threading
import time

import pytest

from equeue_core.client import AdminClient, Message, Producer
from tests.helpers.consume import consume


def _check_in_order(items, topic):
    by_queue: dict[int, list[int]] = {}
    for t, q, off, _body in items:
        assert t == topic
        by_queue.setdefault(q, []).append(off)
    for q, offs in by_queue.items():
        assert offs == sorted(offs), f"queue {q} out of order"
    return by_queue


def test_messages_over_4_queues_are_consumed_completely_in_queue_order(broker, stack):
    n = 100_000 if stack == ("file", "tcp") else 20_000
    with Producer(broker.address) as p:
        sent = []
        for i in range(0, n, 1000):
            sent += p.send_batch([Message("orders", f"m{j}".encode()) for j in range(i, i + 1000)])
    assert {r.queue_id for r in sent} == {0, 1, 2, 3}
    col = consume(broker.address, "g-all", "orders", n, timeout=120)
    assert len(col.items) == n
    assert sorted(b for *_, b in col.items) == sorted(f"m{j}".encode() for j in range(n))
    by_queue = _check_in_order(col.items, "orders")
    assert sum(len(v) for v in by_queue.values()) == n
    for q, offs in by_queue.items():
        assert offs == list(range(len(offs))), f"queue {q} has gaps"


def test_restart_resumes_from_committed_offsets(broker):
    with Producer(broker.address) as p:
        p.send_batch([Message("t", f"a{i}".encode()) for i in range(1000)])
    first = consume(broker.address, "g", "t", 1000)
    assert len(first.items) == 1000
    broker.restart()
    with Producer(broker.address) as p:
        p.send_batch([Message("t", f"b{i}".encode()) for i in range(500)])
    second = consume(broker.address, "g", "t", 500, timeout=30)
    time.sleep(0.5)
    bodies = sorted(b for *_, b in second.items)
    assert bodies == sorted(f"b{i}".encode() for i in range(500)), "re-read or lost messages after restart"


def test_kill9_during_sync_flush_keeps_every_acknowledged_message(tmp_path, stack):
    from tests.helpers.broker import BrokerProcess

    store, transport = stack
    b = BrokerProcess(tmp_path / "data", store=store, transport=transport, flush="sync").start()
    acked: list = []
    stop = threading.Event()

    def produce():
        try:
            with Producer(b.address, retries=0, send_timeout=5) as p:
                i = 0
                while not stop.is_set() and i < 200_000:
                    batch = [Message("crash", f"c{i + k}".encode()) for k in range(20)]
                    res = p.send_batch(batch)
                    acked.extend((r.queue_id, r.queue_offset, m.body) for r, m in zip(res, batch, strict=True))
                    i += 20
        except Exception:
            pass  # the broker died under us: what was acknowledged before is what counts

    t = threading.Thread(target=produce)
    t.start()
    deadline = time.monotonic() + 20
    while len(acked) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    b.kill()
    stop.set()
    t.join(30)
    assert len(acked) >= 2000
    b.start()
    try:
        with AdminClient(b.address) as admin:
            ranges = admin.queue_ranges("crash")
            stored = {}
            for q, (lo, hi) in enumerate(ranges):
                msgs = admin.read_queue("crash", q, lo, hi - lo)
                assert [m.queue_offset for m in msgs] == list(range(lo, hi)), "index not consistent"
                stored.update({(q, m.queue_offset): m.body for m in msgs})
        for q, off, body in acked:
            assert stored.get((q, off)) == body, f"acknowledged message {q}@{off} lost"
    finally:
        b.stop()


def test_held_pull_answers_soon_after_a_send(broker):
    import asyncio

    from equeue_core.client.connection import BrokerConnection
    from equeue_core.codes import Code

    with Producer(broker.address) as p:
        p.send(Message("lp", b"first"), routing_key="k")
        q = p.send(Message("lp", b"x"), routing_key="k").queue_id

        async def held_pull():
            conn = await BrokerConnection(broker.address).connect()
            try:
                start = time.monotonic()
                resp = await conn.request(Code.PULL, {"group": "g", "topic": "lp", "queue_id": q, "offset": 2,
                                                      "max_count": 32, "hold_ms": 15000}, timeout=30)
                return resp.header, time.monotonic() - start, time.monotonic()
            finally:
                await conn.close()

        result = {}
        th = threading.Thread(target=lambda: result.update(r=asyncio.run(held_pull())))
        th.start()
        time.sleep(1.0)
        sent_at = time.monotonic()
        p.send(Message("lp", b"wake"), routing_key="k")
        th.join(20)
    header, held_for, answered_at = result["r"]
    assert header["count"] == 1
    assert held_for >= 0.9, "the pull was not held"
    assert answered_at - sent_at < 0.5, "the held pull was not woken by the arrival"


@pytest.mark.parametrize("mode", ["tags"])
def test_tag_filter_delivers_only_matching_tags(file_broker, mode):
    from equeue_core.client import Consumer
    from tests.helpers.consume import Collector

    with Producer(file_broker.address) as p:
        p.send_batch([Message("tagged", f"{i}".encode(), tag=("a", "b", "c")[i % 3]) for i in range(300)])
    col = Collector(200)
    c = Consumer("gt", file_broker.address, consume_from="first").subscribe("tagged", "a || c")
    c.start(col)
    assert col.wait(30)
    time.sleep(0.5)
    c.close()
    assert len(col.messages) == 200
    assert {m.tag for m in col.messages} == {"a", "c"}


def test_message_can_be_fetched_by_its_id(file_broker):
    with Producer(file_broker.address) as p:
        r = p.send(Message("ids", b"find me", tag="x", keys=("k1",), properties={"p": "v"}))
    with AdminClient(file_broker.address) as admin:
        m = admin.get_message(r.msg_id)
    assert (m.body, m.tag, m.keys, m.properties["p"], m.queue_offset) == (b"find me", "x", ("k1",), "v", r.queue_offset)
    assert m.msg_id == r.msg_id


def test_running_clients_ride_out_a_broker_restart(broker):
    from equeue_core.client import Consumer
    from tests.helpers.consume import Collector

    col = Collector(200)
    c = Consumer("g-restart", broker.address, consume_from="first", heartbeat_interval=0.5,
                 rebalance_interval=1.0, commit_interval=0.5)
    c.subscribe("survive").start(col)
    try:
        with Producer(broker.address) as p:
            p.send_batch([Message("survive", f"before-{i}".encode()) for i in range(100)])
            deadline = time.monotonic() + 20
            while len(col.items) < 100 and time.monotonic() < deadline:
                time.sleep(0.05)
            broker.restart()
            sent = 0
            deadline = time.monotonic() + 30
            while sent < 100 and time.monotonic() < deadline:  # the same producer, reconnecting
                try:
                    p.send_batch([Message("survive", f"after-{i}".encode()) for i in range(sent, sent + 10)])
                    sent += 10
                except Exception:
                    time.sleep(0.2)
        assert col.wait(45), f"consumer got {len(col.items)} of 200 after the restart"
    finally:
        c.close()
    bodies = {b for *_, b in col.items}
    assert bodies >= {f"before-{i}".encode() for i in range(100)} | {f"after-{i}".encode() for i in range(100)}


def test_messages_can_be_found_by_key(broker):
    import subprocess
    import sys

    with Producer(broker.address) as p:
        p.send_batch([Message("keyed", f"m{i}".encode(), keys=(f"order-{i % 50}", "all")) for i in range(500)])
        p.send(Message("keyed", b"newest", keys=("order-7",)))
    with AdminClient(broker.address) as admin:
        found = admin.find_by_key("keyed", "order-7")
        assert [m.body for m in found][:1] == [b"newest"]
        assert sorted(m.body for m in found[1:]) == sorted(f"m{i}".encode() for i in range(7, 500, 50))
        assert all("order-7" in m.keys for m in found)
        assert admin.find_by_key("keyed", "order-70") == []
        assert len(admin.find_by_key("keyed", "all", max_results=5)) == 5
    r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "message", "--topic", "keyed", "--key",
                        "order-7", "--broker", broker.address], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "newest" in r.stdout


def _transports() -> list:
    from tests.conftest import installed

    return [pytest.param(t, id=t) for t in installed("equeue_transports")]


@pytest.mark.failure
@pytest.mark.parametrize("transport", _transports())
def test_new_group_consumes_everything_stored_after_a_kill9_restart_mid_send(tmp_path, transport):
    """Reported on zmq (8 of 8 runs): a producer sends one by one, the broker is killed with a send
    in flight and restarted on the same data dir and port; a new group from `first` stopped at queue
    offset 576 on every queue. The cause was the file store's read ring: the first append after the
    restart starts in the middle of a 64 KiB ring page and claimed the whole page, so records
    recovered from disk in that page's first part were served from the ring as zeros (the consumer
    died on the torn batch). Over zmq the in-flight send is retried once the broker is back, which is
    that first append; here the producer sends once more after the restart on every transport.
    pull_batch=1 makes every record of that page its own read, so the test does not depend on where
    the restart position happens to fall."""
    from equeue_core.client import Consumer
    from tests.helpers.broker import BrokerProcess
    from tests.helpers.consume import Collector

    b = BrokerProcess(tmp_path / "data", transport=transport, flush="sync").start()
    acked: list[bytes] = []
    errors: list[str] = []
    stop = threading.Event()
    p = Producer(b.address).start()
    try:
        def produce() -> None:
            i = 0
            while not stop.is_set() and i < 5000:
                try:
                    p.send(Message("restart", f"m{i}".encode()))
                except Exception as e:  # the broker died under this send (tcp gives up, zmq retries)
                    errors.append(f"{type(e).__name__}: {e}")
                    return
                acked.append(f"m{i}".encode())
                i += 1

        t = threading.Thread(target=produce)
        t.start()
        deadline = time.monotonic() + 20
        while len(acked) < 400 and time.monotonic() < deadline:
            time.sleep(0.02)
        stop.set()  # the thread is inside a send now: its last one is in flight when we kill
        b.kill()
        b.start()
        t.join(60)
        assert not t.is_alive(), "producer thread still blocked after the restart"
        after = p.send(Message("restart", b"after-restart"))  # the same producer goes on sending
        assert after.queue_offset >= 0
        with AdminClient(b.address) as admin:
            stored = {(q, off) for q, (lo, hi) in enumerate(admin.queue_ranges("restart"))
                      for off in range(lo, hi)}
        total = len(stored)
        col = Collector(total)
        c = Consumer("g-after-restart", b.address, consume_from="first", pull_batch=1)
        c.subscribe("restart").start(col)
        try:
            seen, quiet_since, deadline = -1, time.monotonic(), time.monotonic() + 180
            while not col.wait(0.5) and time.monotonic() < deadline:
                if len(col.items) != seen:  # give up only after 30 s without any progress
                    seen, quiet_since = len(col.items), time.monotonic()
                elif time.monotonic() - quiet_since > 30:
                    break
        finally:
            c.close()
        delivered = {(q, off) for _, q, off, _ in col.items}
        by_queue: dict[int, int] = {}
        for q, off in delivered:
            by_queue[q] = max(by_queue.get(q, -1), off)
        assert delivered >= stored, (
            f"{transport}: consumer stopped at {by_queue} with {len(delivered)} of {total} stored")
        # the send in flight at the kill may be stored twice (it was retried): at least once
        assert set(acked) | {b"after-restart"} <= {body for *_, body in col.items}
    finally:
        stop.set()
        p.close()
        b.stop()
