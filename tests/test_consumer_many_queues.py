"""A consumer given many queues at once (1000 queues of one topic, or 100 topics): taking them must
not cost a round trip per queue or per topic, and every queue must still start at its committed
offset."""

from __future__ import annotations

import threading
import time

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.codes import Code
from equeue_core.errors import ConfigError, EQueueError
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import Collector, consume
from tests.test_spare_bodies import connection_spares

QUEUES = 200
TOPICS = 30


class RequestSpy:
    """Counts the requests of each code the in-process clients make, and the most of one code in
    flight at once; every request still goes to the real broker."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count: dict[int, int] = {}
        self.in_flight: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.lock = threading.Lock()
        real = BrokerConnection.request
        spy = self

        async def request(conn, code, header=None, *args, **kwargs):
            with spy.lock:
                spy.count[code] = spy.count.get(code, 0) + 1
                spy.in_flight[code] = spy.in_flight.get(code, 0) + 1
                spy.peak[code] = max(spy.peak.get(code, 0), spy.in_flight[code])
            try:
                return await real(conn, code, header, *args, **kwargs)
            finally:
                with spy.lock:
                    spy.in_flight[code] -= 1

        monkeypatch.setattr(BrokerConnection, "request", request)


def test_a_consumer_taking_many_queues_asks_their_start_offsets_in_one_request_and_starts_each_at_its_commit(
        tmp_path, monkeypatch):
    """Before: one QUERY_OFFSET per assigned queue (200 requests, 64 in flight at a time). Now
    one request names every queue; the offsets still land on the right queues: a second consumer
    of the group gets exactly the messages sent after the first one committed."""
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("many", QUEUES)
        with Producer(b.address) as p:
            p.send_batch([Message("many", f"old{i}".encode()) for i in range(QUEUES)], routing_key=None)
        first = consume(b.address, "g", "many", QUEUES, timeout=60)
        assert len(first.items) == QUEUES
        with Producer(b.address) as p:
            for i in range(60):  # spread over many queues by routing key
                p.send(Message("many", f"new{i}".encode()), routing_key=f"k{i}")

        spy = RequestSpy(monkeypatch)
        col = Collector(60)
        c = Consumer("g", b.address, consume_from="first")
        c.subscribe("many")
        c.start(col)
        try:
            assert col.wait(60), f"got {len(col.items)} of 60"
            assert len(c.assigned_queues()) == QUEUES
        finally:
            c.close()
        bodies = sorted(body.decode() for _t, _q, _o, body in col.items)
        assert bodies == sorted(f"new{i}" for i in range(60)), "a queue started before its committed offset"
        assert spy.count[Code.QUERY_OFFSET] == 1, f"{spy.count[Code.QUERY_OFFSET]} start-offset requests"


def test_a_consumer_of_many_topics_asks_their_routes_together_not_one_after_another(tmp_path, monkeypatch):
    """Before: a rebalance asked each subscribed topic's route in turn (100 topics: 100 round
    trips before the first queue started). Now the routes are asked at once."""
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            for t in range(TOPICS):
                admin.create_topic(f"t{t}", 2)
        with Producer(b.address) as p:
            for t in range(TOPICS):
                p.send(Message(f"t{t}", b"x"))
        spy = RequestSpy(monkeypatch)
        col = Collector(TOPICS)
        c = Consumer("g", b.address, consume_from="first")
        for t in range(TOPICS):
            c.subscribe(f"t{t}")
        c.start(col)
        try:
            assert col.wait(60), f"got {len(col.items)} of {TOPICS}"
        finally:
            c.close()
        assert sorted(t for t, *_ in col.items) == sorted(f"t{t}" for t in range(TOPICS))
        assert spy.peak[Code.ROUTE] > 1, "routes were asked one round trip at a time"


def test_query_offset_of_many_queues_answers_each_and_refuses_a_malformed_or_unknown_entry(tmp_path):
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("a", 2)
            with Producer(b.address) as p:
                p.send_batch([Message("a", b"x") for _ in range(3)], routing_key="k")
            admin.request(Code.COMMIT_OFFSETS, {"group": "g", "offsets": [["a", 1, 1]]})
            ranges = admin.request(Code.QUEUE_RANGES, {"topic": "a"})["ranges"]
            points = admin.request(Code.QUERY_OFFSET, {"group": "g", "queues": [["a", 0], ["a", 1]]})["points"]
            one = [admin.request(Code.QUERY_OFFSET, {"group": "g", "topic": "a", "queue_id": q}) for q in (0, 1)]
            assert points == [[h["offset"], h["min_offset"], h["max_offset"]] for h in one]
            assert [[lo, hi] for _o, lo, hi in points] == ranges
            assert points[1][0] == 1
            for queues, code in [([["a", 0], ["a"]], "protocol"), ("a", "protocol"),
                                 ([["a", 0]] * 4097, "protocol"), ([["a", 0], ["nope", 0]], "topic_not_found")]:
                with pytest.raises(EQueueError) as e:
                    admin.request(Code.QUERY_OFFSET, {"group": "g", "queues": queues})
                assert e.value.code == code, e.value


class BufferedProbe(Collector):
    """A Collector that also records, at every message it handles, how many messages the consumer
    holds pulled and unfinished over all its queues (read from the handler thread: a moment stale,
    which is fine for a peak)."""

    def __init__(self, expected: int) -> None:
        super().__init__(expected)
        self.consumer: Consumer | None = None
        self.peak_buffered = 0

    def __call__(self, m) -> None:
        assert self.consumer is not None
        held = sum(pq.count for pq in list(self.consumer._async.queues.values()))
        self.peak_buffered = max(self.peak_buffered, held)
        super().__call__(m)


def _catch_up(address: str, group: str, expected: int, **options) -> tuple[BufferedProbe, dict[str, int]]:
    probe = BufferedProbe(expected)
    c = Consumer(group, address, consume_from="first", **options)
    probe.consumer = c
    c.subscribe("backlog")
    c.start(probe)
    try:
        assert probe.wait(60), f"got {len(probe.items)} of {expected}"
        return probe, dict(c.stats)
    finally:
        c.close()


def test_a_consumer_catching_up_on_many_queues_holds_at_most_max_backlog_queues_of_them_at_once(tmp_path):
    """Before: every queue with a backlog was pulled at once, so the consumer held every queue's
    pull (and the broker built every answer) before a handler reached the first. Now only
    max_backlog_queues queues catch up at a time: what the consumer holds stays within their flow
    limits, and every message still arrives once."""
    queues, per_queue, flow = 40, 60, 50
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("backlog", queues)
        with Producer(b.address) as p:
            for q in range(queues):
                p.send_batch([Message("backlog", f"{q}-{i}".encode()) for i in range(per_queue)],
                             routing_key=f"key{q}")
        total = queues * per_queue
        limited, stats = _catch_up(b.address, "limited", total, max_backlog_queues=3, flow_max_messages=flow)
        assert sorted(body for *_x, body in limited.items) == sorted(
            f"{q}-{i}".encode() for q in range(queues) for i in range(per_queue))
        # each of the 3 queues catching up holds at most its flow limit plus one pull (half of it);
        # a queue gives its slot up only once everything it pulled was handled
        assert limited.peak_buffered <= 3 * (flow + flow // 2), limited.peak_buffered
        assert 1 <= stats["backlog_queues_peak"] <= 3
        # the same backlog without the limit: every queue pulls at once (the measure is real)
        free, stats = _catch_up(b.address, "free", total, max_backlog_queues=1000, flow_max_messages=flow)
        assert stats["backlog_queues_peak"] > 3
        assert free.peak_buffered > limited.peak_buffered


def test_a_held_pull_of_a_caught_up_queue_never_keeps_a_queue_with_messages_waiting(tmp_path):
    """With one backlog slot, the caught-up queues' pulls (held at the broker for hold_ms) must not
    take it: messages that arrive in two queues while every queue's pull is held are all consumed
    long before any hold would expire."""
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("backlog", 4)
        col = Collector(2 * 600)
        c = Consumer("g", b.address, consume_from="first", max_backlog_queues=1, hold_ms=30000)
        c.subscribe("backlog")
        c.start(col)
        try:
            deadline = time.monotonic() + 30
            while len(c.assigned_queues()) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # every queue's first pull is held at the broker now
            with Producer(b.address) as p:
                for q in (0, 1):  # more than the first pull takes: the next pulls need the slot
                    p.send_batch([Message("backlog", f"{q}-{i}".encode()) for i in range(600)],
                                 routing_key=f"key{q}")
            assert col.wait(20), f"got {len(col.items)} of 1200: a held pull kept the backlog slot"
        finally:
            c.close()


def test_a_queue_that_caught_up_sends_its_held_pull_at_once_and_gives_its_slot_back_when_handled(tmp_path):
    """Before: the queue that caught up kept its backlog slot, and sent no pull at all, until a
    handler had finished what it pulled: its pull loop woke once more per queue just for that
    (1000 queues: a wake-up, a timer and a task each). Now its held pull leaves at once, and the
    slot goes back from the call that finishes its last message, so the other queue still waits
    for it: what the consumer buffers stays bounded by the slots."""
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("slot", 2)
            stored = {0: 0, 1: 0}
            with Producer(b.address) as p:
                for key in range(50):  # until both queues hold a batch of 5
                    results = p.send_batch([Message("slot", b"m") for _ in range(5)], routing_key=f"key{key}")
                    stored[results[0].queue_id] += 5
                    if all(stored.values()):
                        break
            assert all(stored.values()), stored
            release = threading.Event()
            first_queue: list[int] = []
            col = Collector(sum(stored.values()))

            def handler(m):
                if not first_queue:
                    first_queue.append(m.queue_id)
                if m.queue_id == first_queue[0]:
                    release.wait(30)  # the first queue's batch stays in the handler
                col(m)

            c = Consumer("g", b.address, consume_from="first", max_backlog_queues=1, hold_ms=30000)
            c.subscribe("slot")
            c.start(handler)
            try:
                deadline = time.monotonic() + 20
                while admin.stats()["held_pulls"] < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                # the first queue caught up: its held pull is at the broker while its batch is handled
                assert admin.stats()["held_pulls"] == 1
                time.sleep(0.3)
                # and the slot is still its own: the other queue has not been pulled
                assert c.stats["backlog_queues_peak"] == 1
                assert not [item for item in col.items if item[1] != first_queue[0]]
                assert c.stats["pulls"] == 2, c.stats  # the first queue's data pull and held pull
                release.set()
                assert col.wait(20), f"got {len(col.items)} of {col.expected}: the slot never came back"
                deadline = time.monotonic() + 20
                while admin.stats()["held_pulls"] < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert admin.stats()["held_pulls"] == 2  # both queues caught up, each pull held
            finally:
                release.set()
                c.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_max_backlog_queues_must_be_a_whole_number_of_at_least_one(bad):
    with pytest.raises(ConfigError, match="max_backlog_queues"):
        Consumer("g", "127.0.0.1:1", max_backlog_queues=bad)


def test_a_caught_up_queue_keeps_no_pulled_answer_alive_while_its_next_pull_waits_at_the_broker(tmp_path):
    """Before: each queue's pull loop kept its last answer (the Frame, and the finished batch in
    the queue's batch list) while its next pull, a held one, waited at the broker for up to
    hold_ms: 1000 caught-up queues held ~90 MB, and every new answer went to fresh pages. Measured
    with tracemalloc: the bytes the transport allocated for answers that are still alive once
    every message was handled and every queue waits in a held pull."""
    import tracemalloc

    queues, per_queue, body = 40, 100, b"x" * 1000
    with BrokerProcess(tmp_path / "data") as b:
        with AdminClient(b.address) as admin:
            admin.create_topic("backlog", queues)
        with Producer(b.address) as p:
            for q in range(queues):
                p.send_batch([Message("backlog", body) for _ in range(per_queue)], routing_key=f"key{q}")
        tracemalloc.start()
        try:
            col = Collector(queues * per_queue)
            c = Consumer("g", b.address, consume_from="first", hold_ms=60000)
            c.subscribe("backlog")
            c.start(col)
            try:
                assert col.wait(60), f"got {len(col.items)} of {queues * per_queue}"
                col.items.clear()
                col.messages.clear()  # the handler's own copies go; the consumer's must have gone
                time.sleep(0.5)  # every queue's next pull is out (held) by now
                snapshot = tracemalloc.take_snapshot()
                # the bodies the connection keeps to receive its next large answers into
                # (framing.SpareBodies), which no answer refers to any more: bounded whatever
                # the queue count
                spares = connection_spares(c)
                kept = spares.idle_bytes
            finally:
                c.close()
        finally:
            tracemalloc.stop()
    held = sum(s.size for s in snapshot.statistics("filename")
               if s.traceback[0].filename.endswith(("framing.py", "pulled_batch.py")))
    one_queue = per_queue * len(body)
    assert held - kept < 3 * one_queue, f"{held - kept} bytes of answers alive ({(held - kept) // one_queue} queues' worth)"
    assert kept <= spares.max_bytes + 2 * one_queue
