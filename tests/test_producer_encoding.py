"""The producer lays out a batch's records itself (message.append_records: head, topic, tag and
body as separate buffers, joined once into the frame). Those bytes must be exactly what
record.encode_record lays out, every field must come back from the broker as sent on each send
path, and a send the broker refuses must still raise its typed error on each path."""

from __future__ import annotations

import pytest

from equeue_core import record
from equeue_core.client import AdminClient, Message, Producer, message
from equeue_core.client.message import append_records
from equeue_core.errors import InvalidMessageError, InvalidTopicError, MessageTooLargeError

MESSAGES = [
    Message("plain", b"body"),
    Message("plain", b""),
    Message("tagged", b"x" * 1500, tag="TagA"),
    Message("tagged", b"y", tag=""),
    Message("keyed", b"k", keys=["a", "b"]),
    Message("keyed", b"k", keys="single"),
    Message("props", b"p", tag="t", properties={"p1": "v1"}),
    Message("text", "h\u00e9llo"),
    Message("bytearray", bytearray(b"ba")),
    Message("view", memoryview(b"mv")),
]


def _without_born_ts(rec: bytes) -> bytes:
    """born_ts is the producer's clock when the record is laid out: the one field two encodings
    made at different moments may differ in."""
    return rec[:record.OFF_BORN_TS] + rec[record.OFF_BORN_TS + 8:]


# append_record in Python and (when the record hot path is built) with the compiled encode_record
APPEND_RECORD = [message.python_append_record] + ([message._native_append_record] if record.native_module else [])


@pytest.fixture(params=APPEND_RECORD, ids=lambda f: f.__name__)
def each_append_record(request, monkeypatch):
    if request.param is message._native_append_record:
        monkeypatch.setattr(message, "_native_encode", record.native_module.encode_record, raising=False)
    monkeypatch.setattr(message, "append_record", request.param)
    return request.param


@pytest.mark.parametrize("queue_id", [0, 7])
def test_batch_records_are_the_bytes_message_encode_lays_out(queue_id, each_append_record):
    messages = [*MESSAGES, Message("t\u00f6pic", b"a topic the broker refuses still lays out")]
    parts: list[bytes] = []
    total = append_records(parts, messages, queue_id)
    batch = b"".join(parts)
    assert total == len(batch)
    starts = record.scan(batch)
    assert len(starts) == len(messages)
    for m, start, end in zip(messages, starts, starts[1:] + [len(batch)], strict=True):
        assert _without_born_ts(batch[start:end]) == _without_born_ts(m.encode(queue_id)), m


def test_batch_records_keep_the_checks_of_message_encode(each_append_record):
    with pytest.raises(InvalidMessageError):
        append_records([], [Message("t", b"ok"), Message("t", b"x", keys=["bad\x1fkey"])], 0)
    with pytest.raises(InvalidMessageError):
        append_records([], [Message("t", b"x", properties={"n": 1})], 0)  # type: ignore[dict-item]
    with pytest.raises(InvalidMessageError):
        append_records([], [Message("t", 12)], 0)  # type: ignore[arg-type]


def _stored(address: str, topic: str, queue_id: int, offset: int):
    with AdminClient(address) as admin:
        return admin.read_queue(topic, queue_id, offset, 1)[0]


def test_every_field_comes_back_as_sent_through_send_send_async_and_send_batch(file_broker):
    a = file_broker.address
    with Producer(a) as p:
        for m in MESSAGES:
            p.send(Message(m.topic, b"warm-up"))
        sent = [(m, p.send(m)) for m in MESSAGES]
        sent += [(m, f.result(30)) for m, f in [(m, p.send_async(m)) for m in MESSAGES]]
        for m in MESSAGES:
            batch = [m, Message(m.topic, b"second", tag="T2")]
            sent += list(zip(batch, p.send_batch(batch), strict=True))
    for m, r in sent:
        got = _stored(a, r.topic, r.queue_id, r.queue_offset)
        body = m.body.encode() if isinstance(m.body, str) else bytes(m.body)
        keys = (m.keys,) if isinstance(m.keys, str) else tuple(m.keys)
        assert (got.topic, got.body, got.tag, got.keys, got.properties, got.msg_id) == \
            (m.topic, body, m.tag or None, keys, m.properties or {}, r.msg_id), m


def test_a_send_the_broker_refuses_raises_its_typed_error_on_every_path(file_broker):
    too_big = Message("big", b"x" * (4 * 1024 * 1024 + 1))  # over the broker's max_body_size
    with Producer(file_broker.address) as p:
        p.send(Message("big", b"warm-up"))
        with pytest.raises(MessageTooLargeError):
            p.send(too_big)
        with pytest.raises(MessageTooLargeError):
            p.send_async(too_big).result(30)
        with pytest.raises(MessageTooLargeError):
            p.send_batch([Message("big", b"fine"), too_big])
        with pytest.raises(InvalidTopicError):
            p.send(Message("has space", b"x"))
        with pytest.raises(InvalidTopicError):
            p.send_batch([Message("has space", b"x")])
        assert p.send(Message("big", b"still fine")).topic == "big"


def test_send_async_futures_kept_after_their_answers_do_not_pin_the_sent_bodies(file_broker):
    """A SendFuture reads its result from its batch's answer; the batch must drop its records'
    buffers once they are sent, or an app that keeps its futures keeps every body it sent."""
    import gc
    import tracemalloc

    with Producer(file_broker.address) as p:
        p.send(Message("pin", b"warm-up"))
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            futures = [p.send_async(Message("pin", bytes([i]) * 100_000)) for i in range(200)]  # 20 MB
            results = [f.result(30) for f in futures]
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len({(r.queue_id, r.queue_offset) for r in results}) == len(futures) == 200
        assert held < 5_000_000, held
