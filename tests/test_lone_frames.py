"""The single-send shortcuts keep the wire exactly as it was: the TCP server's lone-frame shortcut
(FrameReader.feed_lone, then feed when it declines) cuts any byte stream into the same frames and
reports the same errors as the general parser, and a header encoded once (frame.encode_parts,
what a direct SEND reuses per queue) gives the bytes frame.encode gives."""

from __future__ import annotations

from equeue_plugins.transport_tcp.framing import FrameReader
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue_core import frame as wire
from equeue_core.client import Message, Producer
from tests.helpers.consume import consume

MAX_FRAME = 20 * 1024  # just over the scratch buffer (SCRATCH_SIZE), so oversized frames stay cheap


class Events:
    """What a reader reported, in order (frames by code, request id, header and body)."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def reader(self) -> FrameReader:
        return FrameReader(MAX_FRAME,
                           lambda f: self.seen.append(("frame", f.code, f.request_id, f.header, bytes(f.body))),
                           lambda h, e: self.seen.append(("oversized", h[6], e.code)),
                           lambda h, e: self.seen.append(("bad", h[6], e.code)),
                           lambda e: self.seen.append(("fatal", e.code)))


def drive(stream: bytes, pieces: list[int], lone: bool) -> list[tuple]:
    """Feed `stream` in the given piece sizes (cycled) as the server does (`lone`: feed_lone
    first, its frame counted like on_frame's) or with feed alone."""
    ev = Events()
    reader = ev.reader()
    pos, k = 0, 0
    while pos < len(stream) and not any(e[0] == "fatal" for e in ev.seen):
        buf = reader.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, pieces[k % len(pieces)])
        k += 1
        buf[:n] = stream[pos:pos + n]
        pos += n
        frame = reader.feed_lone(n) if lone else None
        if frame is None:
            reader.feed(n)
        else:
            ev.seen.append(("frame", frame.code, frame.request_id, frame.header, bytes(frame.body)))
    return ev.seen


def good(rid: int, body: bytes) -> bytes:
    return wire.encode_bytes(wire.Frame(1, rid, 0, {"topic": "t", "queue_id": rid % 4}, body))


def bad_header(rid: int) -> bytes:
    header = b"\xc1"  # a msgpack byte that is never valid
    return wire.HEAD.pack(wire.HEAD_SIZE - 4 + len(header), wire.MAGIC, wire.VERSION, 1, 0, 0, rid,
                          len(header)) + header


def oversized(rid: int) -> bytes:
    body = bytes(MAX_FRAME)
    return wire.HEAD.pack(wire.HEAD_SIZE - 4 + len(body), wire.MAGIC, wire.VERSION, 1, 0, 0, rid, 0) + body


frames = st.lists(st.one_of(
    st.builds(good, st.integers(1, 1000), st.binary(max_size=300)),
    st.builds(bad_header, st.integers(1, 1000)),
    st.builds(oversized, st.integers(1, 1000)),
    st.just(b"\x20\x00\x00\x00\x00\x00"),  # bad magic: fatal, the stream ends there
), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(frames, st.lists(st.integers(1, 25_000), min_size=1, max_size=5))
def test_the_lone_frame_shortcut_cuts_every_stream_into_the_same_frames_and_errors(parts, pieces) -> None:
    stream = b"".join(parts)
    assert drive(stream, pieces, lone=True) == drive(stream, pieces, lone=False)


def test_a_read_of_exactly_one_frame_is_taken_by_the_shortcut_and_anything_else_is_left_to_feed() -> None:
    one = good(7, b"x" * 100)
    for data, taken in ((one, True), (one + one, False), (one[:-1], False), (bad_header(3), False)):
        reader = Events().reader()
        buf = reader.get_buffer(-1)
        buf[:len(data)] = data
        frame = reader.feed_lone(len(data))
        assert (frame is not None) == taken
        if taken:
            assert (frame.request_id, frame.header, bytes(frame.body)) == (7, {"topic": "t", "queue_id": 3}, b"x" * 100)


@given(st.dictionaries(st.text(max_size=8), st.integers(-2**63, 2**63), max_size=3), st.binary(max_size=200),
       st.integers(0, 300), st.integers(0, 2**64 - 1))
def test_a_header_encoded_once_gives_the_bytes_frame_encode_gives(header, body, join_below, rid) -> None:
    frame = wire.Frame(1, rid, 0, header, body)
    parts = wire.encode_parts(1, rid, 0, wire.encode_header(header), body, join_below=join_below)
    assert b"".join(parts) == wire.encode_bytes(frame)
    assert len(parts) == (1 if not body or len(body) < join_below else 2)


def test_direct_sends_to_many_queues_and_topics_reuse_their_headers_and_land_where_they_say(file_broker) -> None:
    with Producer(file_broker.address) as p:
        sent = [p.send(Message(f"t{i % 3}", f"m{i}".encode()), routing_key=str(i)) for i in range(60)]
        assert len(p._send_headers) > 3  # several (topic, queue) headers were encoded and reused
    for topic in ("t0", "t1", "t2"):
        got = consume(file_broker.address, "g", topic, 20).items
        assert {(q, off) for _, q, off, _ in got} == {(r.queue_id, r.queue_offset) for r in sent if r.topic == topic}
        assert sorted(b for *_, b in got) == sorted(f"m{i}".encode() for i in range(60) if i % 3 == int(topic[1]))


def test_direct_sends_of_every_message_shape_are_stored_field_for_field(file_broker) -> None:
    """`send` encodes a plain message in one encode_record call and the others with
    Message.encode: tags, keys, properties and str bodies all arrive as sent."""
    shapes = [Message("shapes", b"plain"), Message("shapes", b"tagged", tag="TagA"),
              Message("shapes", b"", tag=""), Message("shapes", "text body"),
              Message("shapes", b"keyed", keys=("k1", "k2")), Message("shapes", b"props", properties={"a": "b"})]
    with Producer(file_broker.address) as p:
        for m in shapes:
            p.send(m, routing_key="one queue")
    got = sorted(consume(file_broker.address, "g", "shapes", len(shapes)).messages, key=lambda m: m.queue_offset)
    assert [(m.body, m.tag, m.keys, m.properties) for m in got] == [
        (b"plain", None, (), {}), (b"tagged", "TagA", (), {}), (b"", None, (), {}), (b"text body", None, (), {}),
        (b"keyed", None, ("k1", "k2"), {}), (b"props", None, (), {"a": "b"})]
