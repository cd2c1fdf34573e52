"""SEND_MULTI (docs/protocol.md): the batches of several topics in one frame, against a real
broker process. The broker stores each section as its SEND would be, in order, or refuses the
whole request when any section is bad; a producer packs the batches it has ready at one moment
into such frames, and falls back to a frame per batch when its broker does not know the request
or the connection fails under one."""

from __future__ import annotations

import threading

import pytest

from equeue_core.broker.multi_send import MAX_SECTIONS, answer_header
from equeue_core.client import AdminClient, Message, Producer, send_multi
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.client.message import msg_ids
from equeue_core.codes import Code
from equeue_core.contracts import AppendResult
from equeue_core.errors import (
    EQueueError,
    InvalidMessageError,
    ProtocolError,
    QueueNotFoundError,
    StoreError,
    SystemTopicError,
)
from equeue_core.frame import FLAG_ERROR, FLAG_RESPONSE, Frame
from tests.helpers.broker import BrokerProcess
from tests.helpers.proxy import CuttableProxy
from tests.helpers.waiting import wait_until


def records(topic: str, queue_id: int, bodies: list[bytes]) -> bytes:
    return b"".join(Message(topic, body).encode(queue_id) for body in bodies)


def multi(address: str, sections: list[tuple[str, int, list[bytes]]]) -> Frame:
    """One SEND_MULTI of these (topic, queue id, bodies) sections; its answer (errors raised)."""
    blobs = [records(t, q, bodies) for t, q, bodies in sections]
    header = {"sections": [[t, q, len(blob)] for (t, q, _), blob in zip(sections, blobs, strict=True)]}
    return raw(address, header, b"".join(blobs))


def raw(address: str, header: dict, body: bytes) -> Frame:
    async def go() -> Frame:
        conn = await BrokerConnection(address).connect()
        try:
            return await conn.request(Code.SEND_MULTI, header, body, timeout=30)
        finally:
            await conn.close()

    return run_sync(go())


@pytest.fixture(scope="module", params=["async", "sync"])
def broker(request, tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp(f"multi-{request.param}") / "data", flush=request.param).start()
    try:
        with AdminClient(b.address) as admin:
            for t in ("m.a", "m.b", "m.bad"):
                admin.create_topic(t, queues=4)
        yield b
    finally:
        b.stop()


def test_each_section_is_stored_in_order_as_its_send_would_be(broker):
    """Two topics, one queue twice, a topic created by the send itself: offsets run on per
    queue across sections, the answer's ids name the stored records, and every record reads
    back under its section's topic and queue (with flush=sync the answer came after the fsync)."""
    with AdminClient(broker.address) as admin:
        a0 = admin.queue_ranges("m.a")[0][1]
        b1 = admin.queue_ranges("m.b")[1][1]
    answer = multi(broker.address, [("m.a", 0, [b"a0", b"a1", b"a2"]), ("m.b", 1, [b"b0", b"b1"]),
                                    ("m.a", 0, [b"a3"]), ("m.new", 2, [b"n0"])])
    h = answer.header
    assert "failed" not in h
    assert [first for first, _ in h["stored"]] == [a0, b1, a0 + 3, 0]
    assert [len(positions) for _, positions in h["stored"]] == [3, 2, 1, 1]
    positions = [p for _, ps in h["stored"] for p in ps]
    assert positions == sorted(positions) and len(set(positions)) == 7  # stored in the frame's order
    ids = msg_ids(h["id_prefix"], positions)
    with AdminClient(broker.address) as admin:
        got = [admin.get_message(i) for i in ids]
        assert [(m.topic, m.queue_id, m.queue_offset, m.body) for m in got] == [
            ("m.a", 0, a0, b"a0"), ("m.a", 0, a0 + 1, b"a1"), ("m.a", 0, a0 + 2, b"a2"),
            ("m.b", 1, b1, b"b0"), ("m.b", 1, b1 + 1, b"b1"), ("m.a", 0, a0 + 3, b"a3"), ("m.new", 2, 0, b"n0")]
        assert [m.body for m in admin.read_queue("m.a", 0, a0, 10)] == [b"a0", b"a1", b"a2", b"a3"]
        assert admin.queue_ranges("m.new")[2] == [0, 1]


GOOD = ("m.bad", 0, [b"fine"])


@pytest.mark.parametrize("case, error", [
    ("queue out of range", QueueNotFoundError),
    ("system topic", SystemTopicError),
    ("existing system topic", SystemTopicError),
    ("malformed records", InvalidMessageError),
    ("lengths off", ProtocolError),
    ("zero length", ProtocolError),
    ("not a list", ProtocolError),
    ("too many", ProtocolError),
])
def test_a_bad_section_refuses_the_whole_request_and_stores_nothing(broker, case, error):
    with AdminClient(broker.address) as admin:
        before = admin.queue_ranges("m.bad")
    good = records(*GOOD)
    if case == "queue out of range":
        call = lambda: multi(broker.address, [GOOD, ("m.bad", 4, [b"x"])])  # noqa: E731
    elif case == "system topic":
        call = lambda: multi(broker.address, [GOOD, ("%DLQ%g", 0, [b"x"])])  # noqa: E731
    elif case == "existing system topic":  # known, with that queue: refused all the same
        with Producer(broker.address) as p:
            p.send(Message("m.later", b"x", delay_level=1))  # the broker makes %SCHEDULE% for it
        with AdminClient(broker.address) as admin:
            assert "%SCHEDULE%" in admin.topics(system=True)
        call = lambda: multi(broker.address, [GOOD, ("%SCHEDULE%", 0, [b"x"])])  # noqa: E731
    elif case == "malformed records":
        bad = records("m.bad", 1, [b"x"])[:-1]  # a record cut short
        call = lambda: raw(broker.address, {"sections": [["m.bad", 0, len(good)], ["m.bad", 1, len(bad)]]},  # noqa: E731
                           good + bad)
    elif case == "lengths off":
        call = lambda: raw(broker.address, {"sections": [["m.bad", 0, len(good) - 1]]}, good)  # noqa: E731
    elif case == "zero length":
        call = lambda: raw(broker.address, {"sections": [["m.bad", 0, len(good)], ["m.bad", 1, 0]]}, good)  # noqa: E731
    elif case == "not a list":
        call = lambda: raw(broker.address, {"sections": {"m.bad": 0}}, good)  # noqa: E731
    else:
        one = records("m.bad", 0, [b""])
        call = lambda: raw(broker.address, {"sections": [["m.bad", 0, len(one)]] * (MAX_SECTIONS + 1)},  # noqa: E731
                           one * (MAX_SECTIONS + 1))
    with pytest.raises(error):
        call()
    with AdminClient(broker.address) as admin:
        assert admin.queue_ranges("m.bad") == before


def test_a_partly_stored_answer_fails_the_sections_not_stored_with_their_error():
    """The broker's answer when the store failed at the second section (broker/multi_send.py)
    as the producer reads it (client/send_multi.py): the first section's results, the store's
    error for the second and third."""
    header = answer_header([AppendResult(7, [100, 150], 200)], StoreError("commit log write failed: disk full"),
                           "PFX")
    frame = Frame(int(Code.SEND_MULTI), 1, FLAG_RESPONSE, header)
    got = send_multi.outcomes(frame, 3)
    assert got[0] == (("PFX", 7, [100, 150]), None)
    for stored, error in got[1:]:
        assert stored is None and type(error) is StoreError and "disk full" in str(error)
    refused = Frame(int(Code.SEND_MULTI), 1, FLAG_RESPONSE | FLAG_ERROR, {"error": "protocol", "message": "no"})
    assert [type(e) for _, e in send_multi.outcomes(refused, 2)] == [ProtocolError, ProtocolError]
    # the producer's shortcut takes only an answer that stored every section; these go to outcomes
    assert send_multi.all_stored(frame, 3) is None
    assert send_multi.all_stored(frame, 1) is None  # a `failed` entry, even with the count right
    assert send_multi.all_stored(refused, 2) is None
    whole = Frame(int(Code.SEND_MULTI), 1, FLAG_RESPONSE,
                  answer_header([AppendResult(7, [100], 150), AppendResult(0, [150, 190], 230)], None, "PFX"))
    assert send_multi.all_stored(whole, 2) == [[7, [100]], [0, [150, 190]]]
    assert send_multi.all_stored(whole, 3) is None


class _Batch:
    def __init__(self, size: int) -> None:
        self.size = size


def test_pack_keeps_the_order_and_the_byte_limit():
    items = [(k, _Batch(n)) for k, n in enumerate([100, 300, 200, 600, 50, 50, 700, 1])]
    frames = send_multi.pack(items, 500)
    assert [k for frame in frames for k, _ in frame] == list(range(8))
    assert [[k for k, _ in frame] for frame in frames] == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert send_multi.pack([], 500) == []
    many = [(k, _Batch(1)) for k in range(MAX_SECTIONS + 10)]  # tiny batches: the section cap cuts
    assert [len(f) for f in send_multi.pack(many, 1 << 20)] == [MAX_SECTIONS, 10]


# ------------------------------------------------------------------ the producer


TOPICS = [f"pk{i}" for i in range(24)]


def _gather_behind_a_frozen_broker(b: BrokerProcess, p: Producer, n: int) -> list:
    """send_async `n` messages round robin over TOPICS while the broker is stopped, until most
    topics' batches wait for room (max_batches_in_flight is 2); then a caller's wait sends them."""
    futures = [p.send_async(Message(TOPICS[i % len(TOPICS)], b"%d" % i)) for i in range(n)]
    assert wait_until(lambda: len(p._async._deferred) >= len(TOPICS) - 4, timeout=10), p._async._deferred
    waiter = threading.Thread(target=lambda: futures[-1].exception(60))
    waiter.start()
    # gone, in SEND_MULTI frames: the loop thread empties _open first and counts the frames it
    # writes after, so the count is waited for too
    assert wait_until(lambda: not p._async._open and p.multi_frames >= 1, timeout=10), p.multi_frames
    return [futures, waiter]


def _assert_stored_in_order(address: str, futures: list, n: int, at_least_once: bool = False) -> None:
    results = [f.result(60) for f in futures]
    for i, r in enumerate(results):
        assert r.topic == TOPICS[i % len(TOPICS)]
    with AdminClient(address) as admin:
        for i in range(0, n, 7):  # each message's id reads back its own body
            assert admin.get_message(results[i].msg_id).body == b"%d" % i
        for t in TOPICS:
            for q, (lo, hi) in enumerate(admin.queue_ranges(t)):
                stored = [int(m.body) for m in admin.read_queue(t, q, lo, hi - lo) if m.body != b"warm-up"]
                if at_least_once:  # a retried batch may be stored twice: each copy in order
                    assert set(stored) >= {i for i, r in enumerate(results) if r.topic == t and r.queue_id == q}
                else:
                    assert stored == sorted(stored)  # per queue, in the order sent
                    assert stored == [i for i, r in enumerate(results) if r.topic == t and r.queue_id == q]


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_producer_sends_the_batches_of_many_topics_in_send_multi_frames(tmp_path, flush):
    b = BrokerProcess(tmp_path / "data", flush=flush).start()
    try:
        with Producer(b.address, max_batches_in_flight=2) as p:
            for t in TOPICS:
                p.send(Message(t, b"warm-up"))
            with b.frozen():
                futures, waiter = _gather_behind_a_frozen_broker(b, p, 2400)
                assert p.multi_frames >= 1
            waiter.join(60)
            _assert_stored_in_order(b.address, futures, 2400)
            assert p._async._sending.multi
    finally:
        b.stop()


def test_a_broker_without_send_multi_gets_a_frame_per_batch_and_loses_nothing(tmp_path):
    """A broker of a release before SEND_MULTI (the proxy hands it the request under a code it
    does not know) answers unknown_request and stores nothing: the producer sends each batch on
    its own, and SEND frames from then on."""
    b = BrokerProcess(tmp_path / "data").start()
    proxy = CuttableProxy(b.port, renumber={int(Code.SEND_MULTI): 999})
    try:
        with Producer(proxy.address, max_batches_in_flight=2) as p:
            for t in TOPICS:
                p.send(Message(t, b"warm-up"))
            with b.frozen():
                futures, waiter = _gather_behind_a_frozen_broker(b, p, 2400)
            waiter.join(60)
            _assert_stored_in_order(b.address, futures, 2400)
            assert not p._async._sending.multi and p.multi_frames == 1
            more = [p.send_async(Message(t, b"after")) for t in TOPICS * 20]
            assert all(f.result(30).topic for f in more)
            assert p.multi_frames == 1
    finally:
        proxy.close()
        b.stop()


def test_a_send_multi_lost_with_its_connection_is_sent_again_batch_by_batch(tmp_path):
    """The connection drops with a SEND_MULTI unanswered: each of its batches is sent again on
    its own (the first try counted), and every message is acknowledged and stored."""
    b = BrokerProcess(tmp_path / "data").start()
    proxy = CuttableProxy(b.port)
    try:
        with Producer(proxy.address, max_batches_in_flight=2, send_timeout=10) as p:
            for t in TOPICS:
                p.send(Message(t, b"warm-up"))
            with b.frozen():
                futures, waiter = _gather_behind_a_frozen_broker(b, p, 2400)
                assert p.multi_frames >= 1
                proxy.drop()  # a blip: the frames out fail, new connections get through
                assert wait_until(lambda: p._async._sending.tasks, timeout=10)
            waiter.join(60)
            _assert_stored_in_order(b.address, futures, 2400, at_least_once=True)
    finally:
        proxy.close()
        b.stop()


def test_unknown_request_maps_to_its_error_type():
    """The fallback above keys on the error type the client maps unknown_request to."""
    refused = Frame(int(Code.SEND_MULTI), 1, FLAG_RESPONSE | FLAG_ERROR, {"error": "unknown_request", "message": "?"})
    (stored, error), = send_multi.outcomes(refused, 1)
    assert stored is None and isinstance(error, EQueueError) and error.code == "unknown_request"


def test_over_zmq_batches_are_not_packed_and_every_message_is_stored(tmp_path):
    """SEND_MULTI goes only through callback requests (`request_now`), which the zmq transport
    does not offer: the producer sends a frame per batch there and never packs batches it would
    then send one by one past max_batches_in_flight."""
    b = BrokerProcess(tmp_path / "data", transport="zmq").start()
    try:
        with Producer(b.address, max_batches_in_flight=2) as p:
            assert not p._async._sending.multi
            futures = [p.send_async(Message(TOPICS[i % len(TOPICS)], b"%d" % i)) for i in range(2400)]
            p.flush()
            assert p.multi_frames == 0
        _assert_stored_in_order(b.address, futures, 2400)
    finally:
        b.stop()


def test_a_frame_whose_sections_were_all_stored_resolves_each_batch_as_its_send_would():
    """_OpenBatch.resolve_stored, the producer's usual SEND_MULTI answer: each batch its own
    answer (topic, queue, first offset, ids), whether someone waits on it already or asks later."""
    from equeue_core.client.producer import SendFuture, _OpenBatch

    waited, later = _OpenBatch(2), _OpenBatch(0)
    waited.count, later.count = 1, 2
    future = waited.future()  # someone waits before the answer
    items = [(("m.a", None, False), waited), (("m.b", None, False), later)]
    _OpenBatch.resolve_stored(items, "PFX", [[7, [100]], [0, [150, 190]]])
    assert future.result(0).first_offset == 7 and future.result(0).topic == "m.a"
    got = [SendFuture(later, i).result(0) for i in range(2)] + [SendFuture(waited, 0).result(0)]
    assert [(r.topic, r.queue_id, r.queue_offset, r.msg_id) for r in got] == [
        ("m.b", 0, 0, msg_ids("PFX", [150])[0]), ("m.b", 0, 1, msg_ids("PFX", [190])[0]),
        ("m.a", 2, 7, msg_ids("PFX", [100])[0])]
    with pytest.raises(ValueError):  # an answer with fewer sections than the frame is a bug, loud
        _OpenBatch.resolve_stored(items, "PFX", [[1, [5]]])
