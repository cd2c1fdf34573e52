"""The push Consumer whose handler threads pull their own queues (`pull_in_handler_threads=True`,
client/pulling_handlers.py): the handler runs on the thread that read its queue's answer, a queue
stays on one thread in offset order, a slow handler holds only its own thread's queues, and a
batch counts as consumed only once it is handled (commit, close, stop_handling). Retries, the
dead-letter topic, rebalance under flow and a failed send-back run for both threading models in
tests/test_consumer_groups.py (`model`). One broker for the module; each test has its own topic
and group."""

from __future__ import annotations

import collections
import threading
import time
import zlib

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.errors import ConfigError
from tests.helpers.broker import BrokerProcess, create_topic, free_port
from tests.helpers.waiting import wait_until

FAST = dict(heartbeat_interval=0.5, rebalance_interval=1.0, commit_interval=0.5, suspend_seconds=0.1)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("pulling") / "data") as b:
        yield b


def _committed(broker: BrokerProcess, group: str, topic: str) -> dict[int, int | None]:
    with AdminClient(broker.address) as admin:
        rows = admin.groups(group).get(group, {}).get("queues", [])
    return {r["queue_id"]: r["committed"] for r in rows if r["topic"] == topic}


def _consumer(broker: BrokerProcess, group: str, topic: str, **options) -> Consumer:
    c = Consumer(group, broker.address, consume_from="first", pull_in_handler_threads=True,
                 **{**FAST, **options})
    return c.subscribe(topic)


def _thread_of(topic: str, queue_id: int, threads: int) -> int:
    """Which handler thread owns a queue (the consumer's hash, restated)."""
    return (zlib.crc32(topic.encode()) + queue_id) % threads


def test_each_queue_is_handled_on_the_thread_that_pulls_it_once_and_in_offset_order(broker):
    topic = create_topic(broker, "ph-order", 8)
    total = 2000
    with Producer(broker.address) as p:
        for i in range(0, total, 100):
            for q in range(8):  # a batch per queue: every queue gets a share
                p.send_batch([Message(topic, f"{j}".encode()) for j in range(i, i + 100) if j % 8 == q],
                             routing_key=f"k{q}")
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.append((m.queue_id, m.queue_offset, threading.current_thread().name))

    c = _consumer(broker, "ph-order-g", topic, threads=3)
    c.start(handler)
    try:
        assert wait_until(lambda: len(seen) >= total, 60), f"{len(seen)} of {total}"
        time.sleep(0.3)  # nothing more may arrive
    finally:
        c.close()
    assert len(seen) == total, "a message was handled twice"
    per_queue: dict[int, list[int]] = collections.defaultdict(list)
    threads_of: dict[int, set[str]] = collections.defaultdict(set)
    for q, off, name in seen:
        per_queue[q].append(off)
        threads_of[q].add(name)
    for q, offs in per_queue.items():
        assert offs == sorted(offs) == list(range(len(offs))), f"queue {q} out of order"
        assert threads_of[q] == {f"equeue-ph-order-g-pull-{_thread_of(topic, q, 3)}"}, threads_of[q]
    assert c.stats["handled"] == total and c.stats["failed"] == 0
    committed = _committed(broker, "ph-order-g", topic)
    assert {q: n for q, n in committed.items() if n} == {q: len(offs) for q, offs in per_queue.items()}


def test_a_slow_handler_holds_only_the_queues_of_its_own_thread(broker):
    topic = create_topic(broker, "ph-slow", 2)
    assert _thread_of(topic, 0, 2) != _thread_of(topic, 1, 2)  # one queue a thread
    release = threading.Event()
    handled: dict[int, int] = collections.Counter()

    def handler(m):
        if m.queue_id == 0:
            release.wait(30)  # queue 0's thread is stuck in the handler
        handled[m.queue_id] += 1

    c = _consumer(broker, "ph-slow-g", topic, threads=2)
    c.start(handler)
    try:
        assert wait_until(lambda: len(c.assigned_queues()) >= 2, 20)
        time.sleep(0.3)
        with Producer(broker.address) as p:
            sent = collections.Counter(p.send(Message(topic, b"%d" % i), routing_key=f"k{i}").queue_id
                                       for i in range(60))
        assert sent[0] and sent[1], sent
        assert wait_until(lambda: handled[1] == sent[1], 20), dict(handled)
        assert handled[0] == 0
        release.set()
        assert wait_until(lambda: handled[0] == sent[0], 20), dict(handled)
    finally:
        release.set()
        c.close()


def test_commit_waits_for_the_batch_in_the_handler_and_never_passes_it(broker):
    topic = create_topic(broker, "ph-commit", 1)
    with Producer(broker.address) as p:
        p.send_batch([Message(topic, b"%d" % i) for i in range(20)])
    inside = threading.Event()
    release = threading.Event()

    def handler(m):
        if m.queue_offset == 10:
            inside.set()
            release.wait(30)

    c = _consumer(broker, "ph-commit-g", topic, threads=1, commit_interval=0.2)
    c.start(handler)
    committer = threading.Thread(target=c.commit)
    try:
        assert inside.wait(20)
        committer.start()
        time.sleep(1.0)  # auto-commits and the commit() call had time to run
        assert committer.is_alive(), "commit() returned while its batch was in the handler"
        assert (_committed(broker, "ph-commit-g", topic).get(0) or 0) <= 10, "committed past the handler"
        release.set()
        committer.join(20)
        assert not committer.is_alive()
        assert _committed(broker, "ph-commit-g", topic) == {0: 20}
    finally:
        release.set()
        c.close()


def test_stop_handling_mid_batch_leaves_it_to_the_group_and_close_commits_what_was_done(broker):
    topic = create_topic(broker, "ph-stop", 1)
    with Producer(broker.address) as p:
        p.send_batch([Message(topic, b"%d" % i) for i in range(30)])  # one pull brings all 30
    first: list[int] = []

    def stopping(m):
        first.append(m.queue_offset)
        if m.queue_offset == 9:
            c.stop_handling()

    c = _consumer(broker, "ph-stop-g", topic, threads=1)
    c.start(stopping)
    try:
        assert wait_until(lambda: 9 in first, 20)
        time.sleep(0.5)
    finally:
        c.close()
    assert first == list(range(10)), "a message was handed out after stop_handling()"
    assert (_committed(broker, "ph-stop-g", topic).get(0) or 0) <= 9, "an unhandled message was committed"
    again: list[int] = []
    c2 = _consumer(broker, "ph-stop-g", topic, threads=1)
    c2.start(lambda m: again.append(m.queue_offset))
    try:
        assert wait_until(lambda: len(again) >= 30 - (_committed(broker, "ph-stop-g", topic).get(0) or 0), 20)
    finally:
        c2.close()
    assert again[-1] == 29 and set(again) >= set(range(10, 30)), again
    assert _committed(broker, "ph-stop-g", topic) == {0: 30}, "close() did not commit what was handled"
    with Producer(broker.address) as p:
        p.send_batch([Message(topic, b"late%d" % i) for i in range(5)])
    later: list[int] = []
    c3 = _consumer(broker, "ph-stop-g", topic, threads=1)
    c3.start(lambda m: later.append(m.queue_offset))
    try:
        assert wait_until(lambda: len(later) >= 5, 20)
        time.sleep(0.3)
    finally:
        c3.close()
    assert later == [30, 31, 32, 33, 34], "a new member did not resume after the committed offset"


@pytest.mark.parametrize("options", [{"orderly": True}, {"mode": "broadcasting"}, {"consume_timeout": 5},
                                     {"parallel_per_queue": 2}, {"flow_max_messages": 10}, {"threads": 0},
                                     {"threads_min": 2}],
                         ids=["orderly", "broadcasting", "consume_timeout", "parallel", "flow", "threads", "threads_min"])
def test_options_that_need_the_loop_threads_pulls_are_refused_by_name(broker, options):
    with pytest.raises(ConfigError) as e:
        Consumer("ph-refused", broker.address, pull_in_handler_threads=True, **options)
    name = next(iter(options))
    assert name in str(e.value)


def test_an_async_handler_and_a_zmq_broker_are_refused(broker):
    topic = create_topic(broker, "ph-refused-async", 1)
    c = _consumer(broker, "ph-async-g", topic)

    async def handler(m):
        return None

    try:
        with pytest.raises(ConfigError, match="async"):
            c.start(handler)
    finally:
        c.close()
    with pytest.raises(ConfigError, match="blocking connections"):
        Consumer("ph-zmq-g", f"zmq://127.0.0.1:{free_port()}", pull_in_handler_threads=True)


def test_a_batch_cut_short_by_a_rebalance_is_not_committed_by_the_member_that_lost_its_queue(broker):
    topic = create_topic(broker, "ph-moved", 2)
    with Producer(broker.address) as p:
        key = next(f"k{i}" for i in range(200) if p.send(Message(topic, b"probe"), routing_key=f"k{i}").queue_id == 1)
    with Producer(broker.address) as p:  # queue 1: the probes, then one batch of 30 a pull brings whole
        p.send_batch([Message(topic, b"%d" % i) for i in range(30)], routing_key=key)
    start = _committed(broker, "ph-moved-g", topic).get(1) or 0
    a_in = threading.Event()
    a_go = threading.Event()
    a_seen: list[int] = []
    b_go = threading.Event()

    def a_handler(m):
        a_seen.append(m.queue_offset)
        if m.queue_id == 1 and m.body == b"5":
            a_in.set()
            a_go.wait(30)  # the queue moves to b while a is in here

    def b_handler(m):
        b_go.wait(30)  # b takes the queue but handles nothing, so commits nothing

    # averagely sorts members by client id: "a-..." keeps queue 0, "b-..." takes queue 1
    a = _consumer(broker, "ph-moved-g", topic, threads=2, client_id="a-member")
    b = _consumer(broker, "ph-moved-g", topic, threads=2, client_id="b-member")
    a.start(a_handler)
    try:
        assert a_in.wait(20)
        b.start(b_handler)
        assert wait_until(lambda: a.assigned_queues() == [(topic, 0)] or a.assigned_queues() == [
            ("%RETRY%ph-moved-g", 0), (topic, 0)], 20), a.assigned_queues()
        handled_before = len(a_seen)
        a_go.set()
        time.sleep(1.5)  # a's thread polls again, drops the queue and commits what it consumed
        assert len(a_seen) == handled_before, "a went on handling a queue it no longer owns"
        b.stop_handling()
        b_go.set()
        b.close()
        committed = _committed(broker, "ph-moved-g", topic).get(1) or 0
        assert committed <= start, f"the batch a never finished was committed up to {committed}"
    finally:
        a_go.set()
        b_go.set()
        a.close()
        b.close()
