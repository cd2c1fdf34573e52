"""Hostile peers at the transport level: garbage, half frames, lies in the head, and slow-loris.

What must hold: a well-behaved client on another connection keeps getting correct answers the
whole time; garbage never reaches the handler; a connection stalled in the middle of a frame is
closed after `frame_read_timeout` and pins no more memory than it sent; an idle connection between
frames is left alone. (A broker-level version of this lives with the broker's tests.)
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import time

import pytest
import zmq
import zmq.asyncio
from equeue_plugins.transport_tcp.framing import MIN_READ, SCRATCH_SIZE, FrameReader
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from equeue_core import frame as wire
from equeue_core.errors import FrameTooLargeError, ProtocolError
from equeue_core.frame import Frame

from .conformance.transports.harness import (
    ECHO,
    HOLD,
    ScriptedHandler,
    run,
    settings,
    transport,
    wait_until,
)

HOST = "127.0.0.1"
LOOPS = ["asyncio", "uvloop"]


def head(length: int, code: int = ECHO, flags: int = 0, request_id: int = 7, header_len: int = 0,
         magic: int = wire.MAGIC) -> bytes:
    return wire.HEAD.pack(length, magic, wire.VERSION, code, flags, 0, request_id, header_len)


def frames_in(message: bytes) -> list[Frame]:
    """The frames in one ZeroMQ message (a message carries one or more, back to back)."""
    out, off = [], 0
    while off < len(message):
        size = wire.frame_length(message[off:off + 4]) + 4
        out.append(wire.decode(message[off:off + size]))
        off += size
    return out


def attack_payloads(rng: random.Random) -> list[tuple[str, bytes]]:
    """(kind, bytes) pairs; kinds ending in '!' expect an error frame back before the close."""
    good = wire.encode_bytes(Frame(ECHO, request_id=5, header={"a": 1}, body=b"b" * 100))
    return [
        ("random", rng.randbytes(rng.randrange(1, 5000))),
        ("random-with-magic", b"\x20\x00\x00\x00\xeb\x01" + rng.randbytes(rng.randrange(0, 3000))),
        ("half-frame", good[: rng.randrange(1, len(good))]),
        ("short-length", head(3) + rng.randbytes(30)),
        ("bad-magic", head(40, magic=0x00) + rng.randbytes(40)),
        ("header-not-msgpack!", head(18 + 4, header_len=4, request_id=11) + b"\xc1\xc1\xc1\xc1"),
        ("header-not-a-map!", head(18 + 2, header_len=2, request_id=12) + b"\x92\x01"),
        ("header-len-lies!", head(18 + 4, header_len=400, request_id=13) + b"abcd"),
        ("header-deeply-nested!", head(18 + 3 + 5000 + 1, header_len=3 + 5000 + 1, request_id=14)
         + b"\x81\xa1a" + b"\x91" * 5000 + b"\xc0"),
        ("header-key-not-utf8!", head(18 + 5, header_len=5, request_id=15) + b"\x81\xa2\xff\xfe\xc0"),
        ("oversized!", head(64 * 1024 * 1024, request_id=16) + rng.randbytes(rng.randrange(0, 50_000))),
        ("good-then-garbage", good + rng.randbytes(rng.randrange(1, 2000))),
    ]


async def _attack(port: int, kind: str, payload: bytes, expect_error: bool) -> str:
    """Write `payload` in random-sized pieces and report what came back."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        rng = random.Random(len(payload))
        i = 0
        while i < len(payload):
            n = rng.randrange(1, 4096)
            writer.write(payload[i:i + n])
            i += n
            await writer.drain()
        if expect_error:
            prefix = await asyncio.wait_for(reader.readexactly(4), 5)
            rest = await asyncio.wait_for(reader.readexactly(wire.frame_length(prefix)), 5)
            reply = wire.decode(prefix + rest)
            assert reply.is_error and reply.is_response, (kind, reply)
            assert reply.header["error"] in (ProtocolError.code, FrameTooLargeError.code), (kind, reply)
            return reply.header["error"]
        return "sent"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionResetError, BrokenPipeError):
            pass


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_garbage_on_many_connections_never_disturbs_a_good_client(loop: str) -> None:
    async def main() -> None:
        t = transport("tcp")
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings(frame_read_timeout=0.5))
        port = server.address[1]
        good = await t.connect(HOST, port, settings())
        stop = asyncio.Event()
        answered = 0

        async def well_behaved() -> None:
            nonlocal answered
            i = 0
            while not stop.is_set() and i < 100_000:
                body = os.urandom(i % 300)
                reply = await good.request(Frame(ECHO, header={"i": i}, body=body), 5)
                assert reply.header == {"i": i} and bytes(reply.body) == body
                answered += 1
                i += 1
                await asyncio.sleep(0)

        client_task = asyncio.ensure_future(well_behaved())
        try:
            rng = random.Random(1234)
            for _round in range(4):
                attacks = [_attack(port, kind, payload, kind.endswith("!"))
                           for _ in range(5) for kind, payload in attack_payloads(rng)]
                results = await asyncio.gather(*attacks)
                assert len(results) == 60
            stop.set()
            await asyncio.wait_for(client_task, 10)
            assert answered > 0
            # Only whole, valid frames ever reached the handler: the good client's, and the valid
            # frame at the front of each "good-then-garbage" attack.
            assert all(f.code == ECHO and (set(f.header) == {"i"} or
                                           (f.header == {"a": 1} and bytes(f.body) == b"b" * 100))
                       for f in handler.requests)
            # Every attacker's connection is gone (stalled halves after frame_read_timeout).
            await wait_until(lambda: len(server.connections) == 1, timeout=10, what="attackers gone")
        finally:
            stop.set()
            client_task.cancel()
            await asyncio.gather(client_task, return_exceptions=True)
            await good.close()
            await server.close()
    run(loop, main, timeout=120)


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_slow_loris_is_closed_after_frame_read_timeout_and_pins_no_memory(loop: str) -> None:
    async def main() -> None:
        t = transport("tcp")
        handler = ScriptedHandler()
        timeout = 0.5
        server = await t.serve(HOST, 0, handler, settings(frame_read_timeout=timeout))
        port = server.address[1]
        good = await t.connect(HOST, port, settings())
        lorises: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            await good.request(Frame(ECHO), 5)
            for i in range(50):
                r, w = await asyncio.open_connection(HOST, port)
                # A head announcing a frame just under 16 MiB, a few bytes of it, then nothing.
                w.write(head(wire.DEFAULT_MAX_FRAME - 8, request_id=i) + b"x" * (i * 100))
                lorises.append((r, w))
            for _ in range(5):  # connected, between frames, silent: legitimate
                idle.append(await asyncio.open_connection(HOST, port))
            await wait_until(lambda: len(server.connections) == 56, what="all connected")
            await wait_until(lambda: sum(c.reader.partial for c in server.connections.values()) == 50,
                             what="all heads received")
            # A head that announces 16 MiB pins the scratch buffer, not 16 MiB.
            held = sum(c.reader.buffered for c in server.connections.values())
            assert held <= 56 * (SCRATCH_SIZE + MIN_READ), held
            started = time.monotonic()
            for r, _w in lorises:
                assert await asyncio.wait_for(r.read(), timeout * 10) == b""  # closed by the server
            assert time.monotonic() - started < timeout * 10
            # The well-behaved and the idle connections are still there and still served.
            await wait_until(lambda: len(server.connections) == 6, what="lorises dropped")
            await asyncio.sleep(timeout * 2)
            assert len(server.connections) == 6
            assert bytes((await good.request(Frame(ECHO, body=b"still"), 5)).body) == b"still"
            r, w = idle[0]
            w.write(wire.encode_bytes(Frame(ECHO, request_id=3, body=b"late")))
            prefix = await asyncio.wait_for(r.readexactly(4), 5)
            reply = wire.decode(prefix + await r.readexactly(wire.frame_length(prefix)))
            assert bytes(reply.body) == b"late" and reply.request_id == 3
            assert not any(f.code != ECHO for f in handler.requests)
        finally:
            for _r, w in lorises + idle:
                w.close()
            await good.close()
            await server.close()
    run(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_drip_feed_within_the_timeout_is_not_a_slow_loris(loop: str) -> None:
    """A frame that arrives slowly but steadily (a byte every timeout/5) is served."""
    async def main() -> None:
        t = transport("tcp")
        handler = ScriptedHandler()
        timeout = 0.5
        server = await t.serve(HOST, 0, handler, settings(frame_read_timeout=timeout))
        r, w = await asyncio.open_connection(HOST, server.address[1])
        try:
            data = wire.encode_bytes(Frame(ECHO, request_id=9, body=b"slow"))
            for i in range(0, len(data), 4):
                w.write(data[i:i + 4])
                await w.drain()
                await asyncio.sleep(timeout / 5)
            prefix = await asyncio.wait_for(r.readexactly(4), 5)
            reply = wire.decode(prefix + await r.readexactly(wire.frame_length(prefix)))
            assert bytes(reply.body) == b"slow"
        finally:
            w.close()
            await server.close()
    run(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_oversized_frame_is_answered_and_skipped_without_buffering(loop: str) -> None:
    """A frame 4x over the max gets an error frame; its bytes are discarded as they arrive (the
    reader never grows past its scratch buffer) and the next frame on the same connection works."""
    async def main() -> None:
        t = transport("tcp")
        handler = ScriptedHandler()
        limit = 1024 * 1024
        server = await t.serve(HOST, 0, handler, settings(max_frame_size=limit))
        r, w = await asyncio.open_connection(HOST, server.address[1])
        try:
            big = wire.encode_bytes(Frame(ECHO, request_id=1, body=b"z" * (4 * limit)), 8 * limit)
            w.write(big[:4096])
            prefix = await asyncio.wait_for(r.readexactly(4), 5)
            reply = wire.decode(prefix + await r.readexactly(wire.frame_length(prefix)))
            assert reply.is_error and reply.request_id == 1
            assert reply.header["error"] == FrameTooLargeError.code
            w.write(big[4096:])
            w.write(wire.encode_bytes(Frame(ECHO, request_id=2, body=b"next")))
            await w.drain()
            prefix = await asyncio.wait_for(r.readexactly(4), 5)
            reply = wire.decode(prefix + await r.readexactly(wire.frame_length(prefix)))
            assert reply.request_id == 2 and bytes(reply.body) == b"next"
            (conn,) = server.connections.values()
            assert conn.reader.buffered <= SCRATCH_SIZE + MIN_READ
            assert not handler.requests[:-1]
        finally:
            w.close()
            await server.close()
    run(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_zmq_garbage_never_disturbs_a_good_client(loop: str) -> None:
    """Raw bytes that are not ZMTP, and ZeroMQ peers sending messages that are not frames: the
    good client keeps getting echoes, the handler sees only good frames, undecodable frames with a
    readable head get error frames."""
    async def main() -> None:
        t = transport("zmq")
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings(frame_read_timeout=0.5))
        port = server.address[1]
        good = await t.connect(HOST, port, settings())
        ctx = zmq.asyncio.Context()
        dealers = []
        try:
            rng = random.Random(99)
            for i in range(40):
                # Not ZMTP at all: libzmq drops these in the handshake (HANDSHAKE_IVL at worst).
                _r, w = await asyncio.open_connection(HOST, port)
                w.write(rng.randbytes(rng.randrange(1, 3000)))
                await w.drain()
                w.close()
                reply = await good.request(Frame(ECHO, header={"i": i}), 5)
                assert reply.header == {"i": i}
            for i in range(10):
                d = ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.connect(f"tcp://{HOST}:{port}")
                dealers.append(d)
                for kind, payload in attack_payloads(rng):
                    if kind == "oversized!":
                        continue  # covered by the conformance kit (MAXMSGSIZE drops the peer)
                    await d.send_multipart([payload] if i % 2 else [payload[:10], payload[10:]])
                    if kind.endswith("!"):
                        # Every message with a readable head is answered, in order; read up to
                        # the answer to this one (its request id is in its head).
                        want = wire.HEAD.unpack_from(payload)[6]
                        answered = False
                        for _ in range(20):
                            parts = await asyncio.wait_for(d.recv_multipart(), 5)
                            for reply in frames_in(b"".join(parts)):
                                assert reply.is_error and reply.header["error"] == ProtocolError.code
                                answered = answered or reply.request_id == want
                            if answered:
                                break
                        assert answered, f"no answer to {kind}"
                reply = await good.request(Frame(ECHO, header={"d": i}), 5)
                assert reply.header == {"d": i}
            assert all(f.code == ECHO and (set(f.header) <= {"i", "d"} or f.header == {"a": 1})
                       for f in handler.requests)
        finally:
            for d in dealers:
                d.close(linger=0)
            ctx.term()
            await good.close()
            await server.close()
    run(loop, main, timeout=60)


def test_pack_helper_matches_the_codec() -> None:
    data = wire.encode_bytes(Frame(ECHO, request_id=7))
    assert data == head(18) and struct.unpack_from("<I", data)[0] == 18


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_flooding_client_is_held_in_its_socket_not_in_server_memory(loop: str) -> None:
    """10,000 requests in flight that the handler sits on: the server stops reading that
    connection at MAX_IN_FLIGHT handler tasks (plus what one read had already brought in), other
    connections are unaffected, and everything is answered once the handler lets go."""
    from equeue_plugins.transport_tcp.server import MAX_IN_FLIGHT

    async def main() -> None:
        t = transport("tcp")
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        flood = await t.connect(HOST, server.address[1], settings())
        other = await t.connect(HOST, server.address[1], settings())
        calls = [asyncio.ensure_future(flood.request(Frame(HOLD), 60)) for _ in range(10_000)]
        try:
            await wait_until(lambda: handler.holding >= MAX_IN_FLIGHT, what="the flood to arrive")
            await asyncio.sleep(0.2)
            assert MAX_IN_FLIGHT <= handler.holding < MAX_IN_FLIGHT + SCRATCH_SIZE // wire.HEAD_SIZE + 1
            assert bytes((await other.request(Frame(ECHO, body=b"fine"), 5)).body) == b"fine"
            handler.release.set()
            replies = await asyncio.wait_for(asyncio.gather(*calls), 30)
            assert all(r.header == {"released": True} for r in replies)
        finally:
            handler.release.set()
            for c in calls:
                c.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await flood.close()
            await other.close()
            await server.close()
    run(loop, main, timeout=90)


# ---------------------------------------------------------------- the TCP frame reader, no sockets

_reader_frames = st.lists(
    st.one_of(
        st.builds(lambda i, n: ("ok", Frame(ECHO, request_id=i, header={"i": i}, body=bytes([i % 256]) * n)),
                  st.integers(1, 2**32), st.sampled_from([0, 1, 100, 5000, 70_000, 300_000])),
        st.builds(lambda i, n: ("big", head(n + 18, request_id=i) + b"\x00" * min(n, 400_000)),
                  st.integers(1, 2**32), st.integers(600_000, 900_000)),
        st.builds(lambda i: ("bad", head(18 + 2, header_len=2, request_id=i) + b"\x92\x01"),
                  st.integers(1, 2**32)),
    ),
    min_size=1, max_size=12)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reader_frames, st.lists(st.integers(1, 200_000), min_size=1, max_size=20))
def test_frame_reader_cuts_any_chunking_of_a_stream_the_same_way(items: list, chunks: list[int]) -> None:
    """Frames, oversized heads (announced length past a 512 KiB max, fewer bytes than announced
    only when last) and undecodable frames, fed in arbitrary pieces: every good frame comes out
    whole and in order, every bad one is reported with its request id, memory stays bounded."""
    max_frame = 512 * 1024
    stream = bytearray()
    expected: list[tuple[str, int]] = []
    for i, (kind, item) in enumerate(items):
        if kind == "ok":
            stream += wire.encode_bytes(item, max_frame * 2)
            expected.append(("frame" if len(wire.encode_bytes(item, max_frame * 2)) <= max_frame
                             else "oversized", item.request_id))
        elif kind == "big":
            announced = wire.HEAD.unpack_from(item)[0] + 4
            if i != len(items) - 1:  # not last: send every byte it announced
                item = item + b"\x00" * (announced - len(item))
            stream += item
            expected.append(("oversized", wire.HEAD.unpack_from(item)[6]))
        else:
            stream += item
            expected.append(("bad", wire.HEAD.unpack_from(item)[6]))
    got: list[tuple[str, int]] = []
    bodies: list[bytes] = []
    fatal: list[Exception] = []

    def on_frame(f: Frame) -> None:
        got.append(("frame", f.request_id))
        bodies.append(bytes(f.body))

    reader = FrameReader(max_frame, on_frame, lambda h, e: got.append(("oversized", h[6])),
                         lambda h, e: got.append(("bad", h[6])), fatal.append)
    pos, k, peak = 0, 0, 0
    while pos < len(stream):
        piece = chunks[k % len(chunks)]
        k += 1
        end = min(len(stream), pos + piece)
        while pos < end:
            buf = reader.get_buffer(-1)
            n = min(len(buf), end - pos)
            buf[:n] = stream[pos:pos + n]
            reader.feed(n)
            pos += n
            peak = max(peak, reader.buffered)
    assert not fatal
    if items[-1][0] == "big" and wire.HEAD.unpack_from(items[-1][1])[0] + 4 > len(items[-1][1]):
        assert reader.partial  # the last oversized frame is still being skipped
    assert got == expected
    accepted = [bytes(item.body) for (kind, item), (outcome, _) in zip(items, expected, strict=True)
                if kind == "ok" and outcome == "frame"]
    assert bodies == accepted
    # Bounded by the largest frame actually accepted (or skipped) plus slack, never 2x the max.
    assert peak <= max_frame + 2 * 64 * 1024
