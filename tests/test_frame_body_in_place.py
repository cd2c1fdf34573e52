"""A large frame's body is received straight into a bytearray of exactly its size (framing.py):
whatever pieces the bytes arrive in, the frame comes out intact, its body is a buffer of its own
(the broker stamps a send's records in it without a copy), the stream stays in step after it
(oversized and undecodable frames included), and the connection goes back to its small scratch."""

from __future__ import annotations

import asyncio
import random

import pytest
from equeue_plugins.transport_tcp.framing import IN_PLACE_RATIO, MIN_READ, SCRATCH_SIZE, FrameReader

from equeue_core import frame as wire
from equeue_core.client import Message, Producer
from tests.helpers.consume import consume

from .conformance.transports.harness import ECHO, ScriptedHandler, run, settings, transport, wait_until


class Collected:
    def __init__(self) -> None:
        self.frames: list[wire.Frame] = []
        self.events: list[tuple[str, int]] = []
        self.fatal: list[Exception] = []

    def reader(self, max_frame: int = wire.DEFAULT_MAX_FRAME) -> FrameReader:
        def on_frame(f: wire.Frame) -> None:
            self.frames.append(f)
            self.events.append(("frame", f.request_id))

        return FrameReader(max_frame, on_frame, lambda h, e: self.events.append(("oversized", h[6])),
                           lambda h, e: self.events.append(("bad", h[6])), self.fatal.append)


def feed_in_pieces(reader: FrameReader, stream: bytes, pieces: list[int]) -> int:
    """Feed `stream` as a socket would (at most what get_buffer offers, in the given piece sizes,
    cycled); returns the most memory the reader held at any point."""
    pos, k, peak = 0, 0, 0
    while pos < len(stream):
        buf = reader.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, pieces[k % len(pieces)])
        k += 1
        buf[:n] = stream[pos:pos + n]
        reader.feed(n)
        pos += n
        peak = max(peak, reader.buffered)
    return peak


def test_a_1_mib_frame_arriving_in_small_pieces_is_received_intact_into_a_body_of_its_own() -> None:
    rng = random.Random(15)
    body = rng.randbytes(1_100_000)
    big = wire.Frame(1, 41, 0, {"topic": "t", "queue_id": 2}, body)
    small = wire.Frame(1, 42, 0, {"topic": "t"}, b"after")
    stream = wire.encode_bytes(big) + wire.encode_bytes(small)
    got = Collected()
    reader = got.reader()
    peak = feed_in_pieces(reader, stream, [1, 3, 7, 1000, 4093, 65_536, 17])
    assert not got.fatal and got.events == [("frame", 41), ("frame", 42)]
    first = got.frames[0]
    assert first.header == {"topic": "t", "queue_id": 2}
    assert type(first.body) is bytearray and first.body == body  # the frame's own, writable
    assert bytes(got.frames[1].body) == b"after"
    # the body buffer of exactly its size plus the scratch: no doubling past it
    assert peak <= len(body) + SCRATCH_SIZE + MIN_READ, peak
    # idle again: the scratch only (a small frame fed in pieces may have grown it by one read)
    assert not reader.partial and reader.buffered <= SCRATCH_SIZE + MIN_READ


def test_a_head_announcing_a_large_frame_pins_only_a_multiple_of_what_arrived() -> None:
    """No amplification: a peer that sends a head announcing 1.5 MiB and then little of the body
    (a slow-loris) makes the reader hold about IN_PLACE_RATIO x what it sent, not the 1.5 MiB."""
    body = b"s" * 1_500_000
    stream = wire.encode_bytes(wire.Frame(1, 9, 0, {"topic": "t"}, body))
    got = Collected()
    reader = got.reader()
    sent = 0
    for piece in (64, 4096, 16_000, 60_000):  # the head, then a little of the body at a time
        buf = reader.get_buffer(-1)
        n = min(len(buf), piece)
        buf[:n] = stream[sent:sent + n]
        reader.feed(n)
        sent += n
        assert reader.partial and reader.buffered <= max(IN_PLACE_RATIO * sent, 2 * sent + SCRATCH_SIZE) + MIN_READ, \
            (sent, reader.buffered)
    assert reader.buffered < len(body) // 2
    feed_in_pieces(reader, stream[sent:], [100_000])
    assert got.events == [("frame", 9)] and got.frames[0].body == body


def test_a_max_size_frame_is_received_intact_and_the_next_one_too() -> None:
    max_frame = wire.DEFAULT_MAX_FRAME
    header = {"topic": "t"}
    overhead = len(wire.encode_bytes(wire.Frame(1, 1, 0, header, b"x"))) - 1
    body = random.Random(1).randbytes(max_frame - overhead)
    stream = wire.encode_bytes(wire.Frame(1, 1, 0, header, body), max_frame)
    assert len(stream) == max_frame
    stream += wire.encode_bytes(wire.Frame(1, 2, 0, header, b"next"))
    got = Collected()
    reader = got.reader(max_frame)
    peak = feed_in_pieces(reader, stream, [SCRATCH_SIZE, 200_000, 1_000_000])
    assert got.events == [("frame", 1), ("frame", 2)] and not got.fatal
    assert got.frames[0].body == body and bytes(got.frames[1].body) == b"next"
    assert peak <= max_frame + 2 * MIN_READ + SCRATCH_SIZE, peak


def test_a_frame_over_the_limit_still_gets_frame_too_large_and_the_stream_stays_in_step() -> None:
    max_frame = 1024 * 1024
    too_big = wire.encode_bytes(wire.Frame(1, 5, 0, {"topic": "t"}, b"y" * max_frame), max_frame * 2)
    fits = wire.encode_bytes(wire.Frame(1, 6, 0, {"topic": "t"}, b"z" * (max_frame // 2)))
    got = Collected()
    reader = got.reader(max_frame)
    peak = feed_in_pieces(reader, too_big + fits, [5000, 70_000])
    assert got.events == [("oversized", 5), ("frame", 6)] and not got.fatal
    assert got.frames[0].body == b"z" * (max_frame // 2)
    assert peak <= max_frame // 2 + SCRATCH_SIZE + MIN_READ, peak


def test_a_large_frame_whose_header_does_not_decode_is_reported_and_the_next_frame_is_intact() -> None:
    body = b"b" * 300_000
    bad_header = b"\x92\x01"  # a msgpack array, not a map: does not decode as a header
    head = wire.HEAD.pack(wire.HEAD_SIZE - wire.LENGTH_SIZE + len(bad_header) + len(body), wire.MAGIC,
                          wire.VERSION, 1, 0, 0, 77, len(bad_header))
    stream = head + bad_header + body + wire.encode_bytes(wire.Frame(1, 78, 0, {}, b"ok"))
    got = Collected()
    peak = feed_in_pieces(got.reader(), stream, [9, 40_000])
    assert got.events == [("bad", 77), ("frame", 78)] and not got.fatal
    assert bytes(got.frames[0].body) == b"ok"
    assert peak <= len(body) + SCRATCH_SIZE + MIN_READ, peak


def test_a_large_frame_with_a_header_larger_than_the_scratch_still_parses() -> None:
    """A header that does not fit the scratch: received by growth, then the body in place."""
    header = {"k": "v" * 100_000}
    body = b"q" * 400_000
    got = Collected()
    feed_in_pieces(got.reader(), wire.encode_bytes(wire.Frame(1, 3, 0, header, body)), [10_000])
    assert got.events == [("frame", 3)] and got.frames[0].header == header and got.frames[0].body == body


def test_a_1_kib_send_batch_stamped_in_the_receive_buffer_is_stored_and_consumed_intact(file_broker) -> None:
    rng = random.Random(3)
    bodies = [rng.randbytes(1024) for _ in range(3000)]
    sent = []
    with Producer(file_broker.address) as p:
        for i in range(0, len(bodies), 1000):  # ~1.1 MiB frames: bodies received in place
            sent += p.send_batch([Message("big", b) for b in bodies[i:i + 1000]])
    assert len(sent) == len(bodies)
    col = consume(file_broker.address, "g", "big", len(bodies), timeout=120)
    assert sorted(b for *_, b in col.items) == sorted(bodies)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tcp_peer_stalled_inside_a_body_received_in_place_is_closed_and_a_whole_one_is_echoed(loop: str) -> None:
    """A 1 MiB frame whose head, header and part of the body came, then nothing: still a
    slow-loris (closed after frame_read_timeout); the same frame sent whole is answered intact."""
    async def main() -> None:
        t = transport("tcp")
        timeout = 0.5
        server = await t.serve("127.0.0.1", 0, ScriptedHandler(), settings(frame_read_timeout=timeout))
        port = server.address[1]
        body = random.Random(7).randbytes(1024 * 1024)
        data = wire.encode_bytes(wire.Frame(ECHO, request_id=11, header={"h": 1}, body=body))
        stalled_r, stalled_w = await asyncio.open_connection("127.0.0.1", port)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        try:
            stalled_w.write(data[:300_000])
            await wait_until(lambda: sum(c.reader.partial for c in server.connections.values()) == 1,
                             what="part of the body received")
            assert await asyncio.wait_for(stalled_r.read(), timeout * 20) == b""  # closed by the server
            w.write(data)
            prefix = await asyncio.wait_for(r.readexactly(4), 10)
            reply = wire.decode(prefix + await r.readexactly(wire.frame_length(prefix)))
            assert reply.request_id == 11 and bytes(reply.body) == body
        finally:
            stalled_w.close()
            w.close()
            await server.close()
    run(loop, main, timeout=60)
