"""LitePullConsumer (client/lite_pull.py): poll() in the caller's thread over held pulls on one
blocking connection. Covers what a poll loop relies on: per-queue order, group membership and
rebalance, at-least-once commits (a new consumer resumes after the committed offset, never past a
message the caller did not come back from), timeouts, close() from another thread, and one-line
errors. One broker for the module; each test uses its own topics and groups."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from equeue_core.client import AdminClient, LitePullConsumer, Message, Producer
from equeue_core.codes import Code
from equeue_core.errors import (
    ClientClosedError,
    ConfigError,
    QueueNotFoundError,
    RequestTimeoutError,
    TopicNotFoundError,
    TransportError,
)
from tests.helpers.broker import BrokerProcess, create_topic, free_port
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("lite") / "data") as b:
        yield b


def _send(broker: BrokerProcess, topic: str, bodies: list[bytes],
          key_of=lambda i: f"key{i}") -> dict[int, list[bytes]]:
    """Send one by one; the bodies per queue, in send order."""
    per_queue: dict[int, list[bytes]] = {}
    with Producer(broker.address) as p:
        for i, body in enumerate(bodies):
            per_queue.setdefault(p.send(Message(topic, body), routing_key=key_of(i)).queue_id, []).append(body)
    return per_queue


def _poll_until(c: LitePullConsumer, count: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += c.poll(0.5)
    return got


def test_assign_polls_every_sent_message_in_per_queue_order(broker):
    topic = create_topic(broker, "lite-order", 4)
    bodies = [f"m{i:03d}".encode() for i in range(120)]
    sent = _send(broker, topic, bodies)
    with LitePullConsumer("lite-order-g", broker.address, consume_from="first", pull_batch=8) as c:
        c.assign(topic)
        assert c.assignment() == [(topic, q) for q in range(4)]
        got = _poll_until(c, len(bodies))
    assert sorted(m.body for m in got) == bodies  # each once
    for q in range(4):
        assert [m.body for m in got if m.queue_id == q] == sent.get(q, [])  # in send order
        offsets = [m.queue_offset for m in got if m.queue_id == q]
        assert offsets == list(range(len(offsets)))


def test_assign_only_the_given_queues(broker):
    topic = create_topic(broker, "lite-some", 4)
    sent = _send(broker, topic, [f"s{i}".encode() for i in range(40)])
    wanted = sorted(sent.get(1, []) + sent.get(3, []))
    assert 0 < len(wanted) < 40
    with LitePullConsumer("lite-some-g", broker.address, consume_from="first") as c:
        c.assign(topic, [1, 3])
        got = _poll_until(c, len(wanted))
        assert c.poll(0.3) == []
    assert sorted(m.body for m in got) == wanted


def test_poll_on_an_empty_topic_returns_nothing_once_its_timeout_passed(broker):
    topic = create_topic(broker, "lite-empty", 2)
    with LitePullConsumer("lite-empty-g", broker.address) as c:
        c.assign(topic)
        start = time.monotonic()
        assert c.poll(0.4) == []
        assert time.monotonic() - start >= 0.35  # it waited (a lower bound: no flake under load)


def test_a_message_sent_while_poll_waits_is_returned_by_that_poll(broker):
    topic = create_topic(broker, "lite-held", 2)
    with LitePullConsumer("lite-held-g", broker.address) as c:
        c.assign(topic)
        assert c.poll(0.1) == []  # the held pulls are in flight now
        timer = threading.Timer(0.3, _send, (broker, topic, [b"late"]))
        timer.start()
        try:
            got = c.poll(20)
        finally:
            timer.join()
    assert [m.body for m in got] == [b"late"]


def test_commit_then_a_new_consumer_resumes_after_the_committed_offset(broker):
    topic = create_topic(broker, "lite-commit", 2)
    _send(broker, topic, [f"c{i}".encode() for i in range(20)], key_of=lambda i: "k")  # one queue
    c = LitePullConsumer("lite-commit-g", broker.address, consume_from="first", pull_batch=5)
    c.assign(topic)
    first = c.poll(10)
    assert [m.body for m in first] == [f"c{i}".encode() for i in range(5)]
    c.commit()
    c.close()
    with LitePullConsumer("lite-commit-g", broker.address, consume_from="first") as again:
        again.assign(topic)
        rest = _poll_until(again, 15)
    assert [m.body for m in rest] == [f"c{i}".encode() for i in range(5, 20)]  # nothing lost, nothing twice


def _committed(broker: BrokerProcess, group: str, topic: str, queue_id: int) -> int | None:
    with AdminClient(broker.address) as admin:
        return admin.request(Code.QUERY_OFFSET, {"group": group, "topic": topic, "queue_id": queue_id})["offset"]


def test_auto_commit_and_close_commit_what_the_caller_came_back_from_but_not_the_last_poll(broker):
    """At least once: the messages of the last poll (the caller did not come back from them) are
    not committed, so the next consumer gets them again; the earlier ones are not repeated."""
    topic = create_topic(broker, "lite-auto", 1)
    _send(broker, topic, [f"a{i}".encode() for i in range(12)])
    c = LitePullConsumer("lite-auto-g", broker.address, consume_from="first", pull_batch=4,
                         auto_commit_interval=0.0)
    c.assign(topic)
    assert [m.body for m in c.poll(10)] == [f"a{i}".encode() for i in range(4)]
    assert _committed(broker, "lite-auto-g", topic, 0) is None  # nothing came back yet
    assert [m.body for m in c.poll(10)] == [f"a{i}".encode() for i in range(4, 8)]
    assert wait_until(lambda: _committed(broker, "lite-auto-g", topic, 0) == 4, 10)  # auto-commit
    c.close()
    assert _committed(broker, "lite-auto-g", topic, 0) == 4  # close did not commit a4-a7
    with LitePullConsumer("lite-auto-g", broker.address, consume_from="first") as again:
        again.assign(topic)
        rest = _poll_until(again, 8)
    assert [m.body for m in rest] == [f"a{i}".encode() for i in range(4, 12)]


def test_two_subscribed_members_split_the_queues_and_the_survivor_takes_all(broker):
    topic = create_topic(broker, "lite-group", 4)
    a = LitePullConsumer("lite-group-g", broker.address, consume_from="first", rebalance_interval=1.0)
    b = LitePullConsumer("lite-group-g", broker.address, consume_from="first", rebalance_interval=1.0)
    try:
        a.subscribe(topic)
        b.subscribe(topic)

        def split() -> bool:
            a.poll(0.01), b.poll(0.01)
            qa, qb = set(a.assignment()), set(b.assignment())
            return len(qa) == 2 and len(qb) == 2 and not qa & qb

        assert wait_until(split, 20)
        _send(broker, topic, [f"g{i}".encode() for i in range(40)])
        got_a: list = []
        got_b: list = []
        deadline = time.monotonic() + 20
        while len(got_a) + len(got_b) < 40 and time.monotonic() < deadline:
            got_a += a.poll(0.1)
            got_b += b.poll(0.1)
        assert {m.queue_id for m in got_a} <= {q for _, q in a.assignment()}
        assert {m.queue_id for m in got_b} <= {q for _, q in b.assignment()}
        assert sorted(m.body for m in got_a + got_b) == sorted(f"g{i}".encode() for i in range(40))
        a.commit()
        b.commit()
        b.close()
        assert wait_until(lambda: a.poll(0.01) is not None and len(a.assignment()) == 4, 20)
        _send(broker, topic, [f"h{i}".encode() for i in range(8)])
        later = _poll_until(a, 8)
        assert sorted(m.body for m in later) == sorted(f"h{i}".encode() for i in range(8))
    finally:
        a.close()
        b.close()


def test_seek_back_returns_the_messages_again(broker):
    topic = create_topic(broker, "lite-seek", 1)
    _send(broker, topic, [f"k{i}".encode() for i in range(6)])
    with LitePullConsumer("lite-seek-g", broker.address, consume_from="first") as c:
        c.assign(topic)
        assert len(_poll_until(c, 6)) == 6
        c.seek(topic, 0, 2)
        again = _poll_until(c, 4)
        with pytest.raises(ConfigError, match="not assigned"):
            c.seek(topic, 5, 0)
    assert [m.body for m in again] == [f"k{i}".encode() for i in range(2, 6)]


def test_a_paused_queue_sends_no_pull_until_resumed_and_the_others_go_on(broker):
    topic = create_topic(broker, "lite-pause", 2)
    with LitePullConsumer("lite-pause-g", broker.address, consume_from="first", hold_ms=200) as c:
        c.assign(topic)
        c.poll(0.3)  # the held pulls are in flight
        c.pause(topic, 0)
        sent = _send(broker, topic, [f"p{i}".encode() for i in range(40)])
        assert set(sent) == {0, 1}
        got = _poll_until(c, len(sent[1]), 10)
        assert [m.body for m in got] == sent[1], "only the queue that is not paused"
        assert c.poll(0.5) == []
        assert c._queues[(topic, 0)].pull_id is None, "the paused queue was pulled"
        assert c.stats["pulls"] >= 3  # the first two pulls and queue 1's next ones
        c.resume(topic, 0)
        again = _poll_until(c, len(sent[0]), 10)
        with pytest.raises(ConfigError, match="not assigned"):
            c.pause(topic, 7)
    assert [m.body for m in again] == sent[0]


def test_tag_expression_returns_only_matching_messages(broker):
    topic = create_topic(broker, "lite-tags", 1)
    with Producer(broker.address) as p:
        for i in range(10):
            p.send(Message(topic, f"t{i}".encode(), tag="even" if i % 2 == 0 else "odd"))
    with LitePullConsumer("lite-tags-g", broker.address, consume_from="first") as c:
        c.assign(topic, expression="even")
        got = _poll_until(c, 5)
        assert c.poll(0.2) == []
    assert [m.body for m in got] == [f"t{i}".encode() for i in range(0, 10, 2)]


def test_close_from_another_thread_ends_a_waiting_poll(broker):
    topic = create_topic(broker, "lite-close", 1)
    c = LitePullConsumer("lite-close-wait-g", broker.address)
    c.assign(topic)
    result: list = []
    poller = threading.Thread(target=lambda: result.append(c.poll(60)))
    poller.start()
    time.sleep(0.3)  # poll is waiting in recv by now (if not, it returns [] all the same)
    c.close()
    poller.join(15)
    assert not poller.is_alive()
    assert result == [[]]
    with pytest.raises(ClientClosedError):
        c.poll(0.1)


def test_unknown_topic_and_queue_are_clear_errors(broker):
    create_topic(broker, "lite-known", 2)
    with LitePullConsumer("lite-err-g", broker.address) as c:
        with pytest.raises(TopicNotFoundError, match="lite-nope"):
            c.assign("lite-nope")
        with pytest.raises(QueueNotFoundError, match="0..1"):
            c.assign("lite-known", [2])
    with LitePullConsumer("lite-err-g", broker.address) as c:
        with pytest.raises(TopicNotFoundError, match="lite-nope"):
            c.subscribe("lite-nope")
        c.subscribe("lite-known")
        with pytest.raises(ConfigError, match="not both"):
            c.assign("lite-known")


def test_broker_down_is_a_transport_error():
    port = free_port()  # nothing listens there
    with LitePullConsumer("lite-down-g", f"127.0.0.1:{port}") as c:
        with pytest.raises(TransportError, match=f"127.0.0.1:{port}"):
            c.assign("anything")


@pytest.mark.parametrize("option", [{"nameserver": "127.0.0.1:9876"}, {"mode": "broadcasting"}, {"orderly": True},
                                    {"threads_min": 2}])
def test_a_push_consumer_option_is_refused_by_name(option):
    with pytest.raises(ConfigError, match=f"does not take {next(iter(option))} .*use Consumer"):
        LitePullConsumer("g", "127.0.0.1:1", **option)


def test_zmq_address_is_refused_with_a_config_error():
    with pytest.raises(ConfigError, match="tcp or tls"):
        LitePullConsumer("lite-zmq-g", f"zmq://127.0.0.1:{free_port()}")


@pytest.mark.parametrize("transport", ["tls"])
def test_over_tls_poll_returns_messages_and_close_ends_a_waiting_poll(tmp_path, transport):
    b = BrokerProcess(tmp_path / "data", transport=transport).start()
    try:
        topic = create_topic(b, "lite-tls", 2)
        sent = _send(b, topic, [f"t{i}".encode() for i in range(10)])
        c = LitePullConsumer("lite-tls-g", b.address, consume_from="first")
        c.assign(topic)
        got = _poll_until(c, 10)
        assert {q: [m.body for m in got if m.queue_id == q] for q in sent} == sent
        result: list = []
        poller = threading.Thread(target=lambda: result.append(c.poll(60)))
        poller.start()
        time.sleep(0.3)
        c.close()
        poller.join(15)
        assert not poller.is_alive() and result == [[]]
    finally:
        b.stop()


def test_a_broker_that_stops_answering_ends_poll_with_a_timeout_and_poll_recovers(broker):
    """A hung broker (SIGSTOP: no FIN, no answers) must not leave poll returning [] for ever."""
    topic = create_topic(broker, "lite-hung", 1)
    c = LitePullConsumer("lite-hung-g", broker.address, hold_ms=100, request_timeout=0.5)
    try:
        c.assign(topic)
        assert c.poll(0.2) == []
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RequestTimeoutError, match="no answer from the broker"):
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    c.poll(0.2)
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        _send(broker, topic, [b"after"])
        assert [m.body for m in _poll_until(c, 1)] == [b"after"]
    finally:
        c.close()


def _pulls_of_queues_behind(c: LitePullConsumer) -> int:
    """Pulls in flight of queues the broker last said have a backlog."""
    return sum(1 for q in c._queues.values() if q.pull_id is not None and q.behind)


def test_catching_up_on_many_queues_keeps_at_most_max_backlog_queues_of_their_pulls_in_flight(broker):
    """40 queues with 60 messages each and 3 turns: after every poll at most 3 queues with a
    backlog have a pull out (without turns every one of the 40 re-pulls at once, and the broker
    builds all 40 answers). Every message still comes back once, in per-queue order."""
    topic = create_topic(broker, "lite-turns", 40)
    bodies = [f"t{i:04d}".encode() for i in range(2400)]
    with Producer(broker.address) as p:
        futures = [p.send_async(Message(topic, b), routing_key=f"k{i}") for i, b in enumerate(bodies)]
        sent: dict[int, list[bytes]] = {}
        for f, b in zip(futures, bodies, strict=True):
            sent.setdefault(f.result(30).queue_id, []).append(b)
    assert sum(1 for q in sent.values() if len(q) > 16) >= 30  # most queues have a backlog of pulls
    with LitePullConsumer("lite-turns-g", broker.address, consume_from="first", pull_batch=8,
                          max_backlog_queues=3) as c:
        c.assign(topic)
        got: list = []
        worst = 0
        deadline = time.monotonic() + 30
        while len(got) < len(bodies) and time.monotonic() < deadline:
            got += c.poll(0.5)
            worst = max(worst, _pulls_of_queues_behind(c))
        assert worst <= 3
        assert c.stats["backlog_queues_peak"] == 3  # the turns were used, all of them
        assert c._turns <= 3
    assert sorted(m.body for m in got) == sorted(bodies)  # each once
    by_queue: dict[int, list[bytes]] = {}
    for m in got:
        by_queue.setdefault(m.queue_id, []).append(m.body)
    assert by_queue == sent  # in send order


def test_pulls_held_at_the_broker_never_wait_for_a_turn(broker):
    """One turn, every queue caught up (its pull held at the broker for 30 s), then 1200
    messages to two queues: all come back well before the holds end. Held pulls taking turns
    would leave those messages behind a 30 s hold."""
    topic = create_topic(broker, "lite-held", 6)
    with LitePullConsumer("lite-held-g", broker.address, consume_from="last", pull_batch=16,
                          hold_ms=30000, max_backlog_queues=1) as c:
        c.assign(topic)
        assert c.poll(0.3) == []  # every queue's pull is out and held
        started = time.monotonic()
        bodies = [f"h{i:04d}".encode() for i in range(1200)]
        _send(broker, topic, bodies, key_of=lambda i: "a" if i % 2 else "b")
        got = _poll_until(c, len(bodies), timeout=25)
        assert time.monotonic() - started < 25
        assert c.stats["backlog_queues_peak"] == 1
    assert sorted(m.body for m in got) == bodies


def test_seek_on_a_queue_holding_a_turn_hands_the_turn_on(broker):
    """One turn and three queues with a backlog: seeking the queue that holds the turn (its
    pull's answer is dropped) passes the turn to a waiting queue; nothing stalls and no turn leaks."""
    topic = create_topic(broker, "lite-seek-turn", 3)
    sent = _send(broker, topic, [f"s{i:03d}".encode() for i in range(300)])
    assert len(sent) == 3
    with LitePullConsumer("lite-seek-turn-g", broker.address, consume_from="first", pull_batch=4,
                          max_backlog_queues=1) as c:
        c.assign(topic)
        first = c.poll(5)
        assert first
        holder = next(q for q in c._queues.values() if q.turn)
        c.seek(holder.topic, holder.queue_id, 0)
        assert not holder.turn
        assert c._turns == sum(q.turn for q in c._queues.values()) <= 1  # handed on, never leaked
        everything = {b for q in sent.values() for b in q}
        seen = {m.body for m in first}
        deadline = time.monotonic() + 30
        while seen != everything and time.monotonic() < deadline:
            seen |= {m.body for m in c.poll(0.5)}
            assert c._turns == sum(q.turn for q in c._queues.values()) <= 1
        assert seen == everything
        assert not c._waiting


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_a_bad_max_backlog_queues_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="max_backlog_queues must be a whole number >= 1"):
        LitePullConsumer("g", "127.0.0.1:1", max_backlog_queues=bad)


@pytest.mark.parametrize("mode", ["assign", "subscribe"])
def test_a_queue_with_a_backlog_is_read_in_one_pull_and_its_start_asked_with_the_others(broker, monkeypatch, mode):
    """300 messages in one queue of 40: the first poll returns all 300 (the start point's end
    says how many there are; growing from 32 took four pulls; max_poll_records lets a poll
    return them all), and the 40 queues' start points come from one QUERY_OFFSET, not one per
    queue."""
    from equeue_core.client.connection import BrokerConnection

    topic = create_topic(broker, f"lite-expect-{mode}", 40)
    sent = _send(broker, topic, [f"e{i:03d}".encode() for i in range(300)], key_of=lambda i: "one")
    assert len(sent) == 1
    queries = []
    real = BrokerConnection.request

    async def request(conn, code, header=None, *args, **kwargs):
        if code == Code.QUERY_OFFSET:
            queries.append(header)
        return await real(conn, code, header, *args, **kwargs)

    monkeypatch.setattr(BrokerConnection, "request", request)
    with LitePullConsumer(f"lite-expect-{mode}-g", broker.address, consume_from="first",
                          max_poll_records=300) as c:
        getattr(c, mode)(topic)
        first = []
        deadline = time.monotonic() + 10
        while not first and time.monotonic() < deadline:
            first = c.poll(1.0)
    assert [m.body for m in first] == next(iter(sent.values()))
    assert len(queries) == 1 and len(queries[0]["queues"]) == 40


@pytest.mark.parametrize("pull_batch,max_poll_records", [(8, 256), (64, 16)])
def test_a_rebalance_while_catching_up_with_one_turn_loses_no_turn_and_no_message(broker, pull_batch,
                                                                                   max_poll_records):
    """A member catching up on 8 queues with one turn; a second member joins (the first gives up
    half its queues, one of them maybe holding the turn or waiting for it, or part of an answer
    not returned yet) and leaves again (the first takes them back). Every message arrives, and
    the first member's turns add up."""
    topic = create_topic(broker, f"lite-rebalance-turns-{pull_batch}", 8)
    bodies = [f"r{i:04d}".encode() for i in range(1600)]
    _send(broker, topic, bodies)
    options = {"consume_from": "first", "rebalance_interval": 1.0, "pull_batch": pull_batch,
               "max_backlog_queues": 1, "max_poll_records": max_poll_records}
    a = LitePullConsumer(f"lite-rt-g{pull_batch}", broker.address, **options)
    b = LitePullConsumer(f"lite-rt-g{pull_batch}", broker.address, **options)
    seen: set[bytes] = set()
    try:
        a.subscribe(topic)
        for _ in range(5):
            seen |= {m.body for m in a.poll(0.2)}
        assert a._waiting  # catching up: queues wait for the one turn
        b.subscribe(topic)

        def split() -> bool:
            seen.update(m.body for m in a.poll(0.05))
            seen.update(m.body for m in b.poll(0.05))
            return len(a.assignment()) == 4 and len(b.assignment()) == 4

        assert wait_until(split, 20)
        assert a._turns == sum(q.turn for q in a._queues.values()) <= 1
        b.commit()
        b.close()
        deadline = time.monotonic() + 30
        while len(seen) < len(bodies) and time.monotonic() < deadline:
            seen |= {m.body for m in a.poll(0.2)}
            assert a._turns == sum(q.turn for q in a._queues.values()) <= 1
        assert len(a.assignment()) == 8
        assert seen == set(bodies)
    finally:
        a.close()
        b.close()


def _one_queue_of(broker: BrokerProcess, name: str, count: int, tag_of=lambda i: None) -> tuple[str, list[bytes]]:
    """A topic of one queue holding `count` messages (sent in one batch), and their bodies."""
    topic = create_topic(broker, name, 1)
    bodies = [f"{name}-{i:04d}".encode() for i in range(count)]
    with Producer(broker.address) as p:
        p.send_batch([Message(topic, b, tag=tag_of(i)) for i, b in enumerate(bodies)])
    return topic, bodies


def _polls_until(c: LitePullConsumer, count: int, timeout: float = 10.0) -> list[list]:
    """What each poll returned (empty polls left out) until `count` messages came."""
    polls: list[list] = []
    deadline = time.monotonic() + timeout
    while sum(map(len, polls)) < count and time.monotonic() < deadline:
        got = c.poll(1.0)
        if got:
            polls.append(got)
    return polls


def test_a_poll_returns_at_most_max_poll_records_and_the_rest_of_the_answer_comes_next(broker):
    """600 messages come in one pull (the backlog is known at the start), yet each poll returns
    at most 256, in order, and the three polls take no second pull of the queue's backlog."""
    topic, bodies = _one_queue_of(broker, "lite-maxpoll", 600)
    with LitePullConsumer("lite-maxpoll-g", broker.address, consume_from="first") as c:
        assert c.max_poll_records == 256
        c.assign(topic)
        polls = _polls_until(c, 600)
        assert [len(p) for p in polls] == [256, 256, 88]
        assert c.stats["pulls"] <= 2  # the backlog's one pull, then at most the held one
    assert [m.body for p in polls for m in p] == bodies


def test_commit_after_part_of_an_answer_commits_only_what_poll_returned(broker):
    """At least once with an answer split over polls: commit() after the first poll records the
    offset of the first message not returned, and the next consumer starts there."""
    topic, bodies = _one_queue_of(broker, "lite-maxpoll-commit", 300)
    c = LitePullConsumer("lite-maxpoll-commit-g", broker.address, consume_from="first", max_poll_records=100)
    c.assign(topic)
    first = _poll_until(c, 1)
    assert [m.body for m in first] == bodies[:100]
    c.commit()
    assert _committed(broker, "lite-maxpoll-commit-g", topic, 0) == 100
    c.close()
    with LitePullConsumer("lite-maxpoll-commit-g", broker.address, consume_from="first") as again:
        again.assign(topic)
        rest = _poll_until(again, 200)
    assert [m.body for m in rest] == bodies[100:]


def test_seek_and_pause_drop_the_rest_of_an_answer_and_lose_nothing(broker):
    """A seek moves the queue even while part of an answer waits to be returned; a pause forgets
    that part and the queue is read again from its first message not returned after resume()."""
    topic, bodies = _one_queue_of(broker, "lite-maxpoll-seek", 300)
    with LitePullConsumer("lite-maxpoll-seek-g", broker.address, consume_from="first", max_poll_records=100) as c:
        c.assign(topic)
        assert [m.body for m in _poll_until(c, 1)] == bodies[:100]
        c.seek(topic, 0, 30)
        assert [m.body for m in _poll_until(c, 1)] == bodies[30:130]
        c.pause(topic, 0)
        assert c.poll(0.3) == []
        c.resume(topic, 0)
        after = _poll_until(c, 170)
    assert [m.body for m in after] == bodies[130:]


def test_a_tag_filter_over_an_answer_split_across_polls(broker):
    """Every other message tagged "a": the polls return only those, in order, none above
    max_poll_records, and commit() after the last moves the offset past the whole answer."""
    topic, bodies = _one_queue_of(broker, "lite-maxpoll-tags", 600, tag_of=lambda i: "a" if i % 2 == 0 else "b")
    with LitePullConsumer("lite-maxpoll-tags-g", broker.address, consume_from="first", max_poll_records=64) as c:
        c.assign(topic, expression="a")
        polls = _polls_until(c, 300)
        c.commit()
        assert _committed(broker, "lite-maxpoll-tags-g", topic, 0) == 600
    assert max(map(len, polls)) <= 64 and len(polls) >= 5
    assert [m.body for p in polls for m in p] == bodies[::2]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "256"])
def test_a_bad_max_poll_records_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="max_poll_records must be a whole number >= 1"):
        LitePullConsumer("g", "127.0.0.1:1", max_poll_records=bad)
