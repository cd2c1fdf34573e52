"""The blocking TCP connection's frame reader (plugins/transport_tcp/blocking.py), byte by byte.

A LitePullConsumer reads pull answers of up to ~130 KB, several of them often already waiting in
the socket; a direct send reads small answers that fit one receive. These tests feed the reader
exact byte streams from a loopback server socket (the bytes a broker would send) and check that
every frame comes out whole, in order, with nothing lost between reads: frames larger than one
receive arriving back to back, a frame cut at every kind of boundary, and a frame that trickles
in slower than the read's timeout (the read returns None and the next one finishes the frame).
And the write side's `write_many`: several requests in one call, each under its own id, or none
of them when one is too large.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from equeue_core import frame as wire
from equeue_core.contracts import TransportSettings
from equeue_core.errors import FrameTooLargeError
from equeue_core.plugins import get_plugin_manager


class ByteServer:
    """One accepted loopback connection whose bytes the test writes by hand."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.peer: socket.socket | None = None
        self._accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.peer, _ = self.listener.accept()
        self._accepted.set()

    def send(self, data: bytes) -> None:
        assert self._accepted.wait(10), "the client never connected"
        assert self.peer is not None
        self.peer.sendall(data)

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
        self.listener.close()


@pytest.fixture
def wire_pair():
    server = ByteServer()
    conn = get_plugin_manager().transport("tcp").connect_blocking("127.0.0.1", server.port, TransportSettings())
    conn.write(wire.Frame(1, header={"hello": 1}))  # connects (the server never reads it)
    try:
        yield server, conn
    finally:
        conn.close()
        server.close()


def frame_bytes(request_id: int, body_size: int) -> bytes:
    body = bytes((request_id + i) % 251 for i in range(body_size))
    return b"".join(bytes(b) for b in wire.encode(wire.Frame(10, request_id, wire.FLAG_RESPONSE,
                                                            {"n": request_id}, body)))


def check(got: wire.Frame | None, request_id: int, body_size: int) -> None:
    assert got is not None
    assert got.request_id == request_id and got.header == {"n": request_id}
    assert bytes(got.body) == bytes((request_id + i) % 251 for i in range(body_size))


def test_frames_larger_than_one_receive_arriving_back_to_back_are_each_read_whole(wire_pair):
    server, conn = wire_pair
    sizes = [200_000, 150_000, 10, 70_000, 0, 133_000]
    server.send(b"".join(frame_bytes(i + 1, n) for i, n in enumerate(sizes)))
    for i, n in enumerate(sizes):
        check(conn.read(10), i + 1, n)
    assert conn.read(0.05) is None  # nothing left over, nothing invented


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 30, 64 * 1024, 64 * 1024 + 7, 140_000])
def test_a_frame_cut_anywhere_is_read_whole_and_the_next_one_after_it(wire_pair, cut):
    server, conn = wire_pair
    data = frame_bytes(1, 150_000) + frame_bytes(2, 40)
    server.send(data[:cut])
    timer = threading.Timer(0.05, server.send, args=(data[cut:],))
    timer.start()
    try:
        check(conn.read(10), 1, 150_000)
        check(conn.read(10), 2, 40)
    finally:
        timer.join()


def test_a_frame_slower_than_the_read_timeout_is_finished_by_the_next_read(wire_pair):
    """What arrived of a frame when a read times out stays for the next read: nothing is lost
    and nothing is read twice."""
    server, conn = wire_pair
    data = frame_bytes(7, 180_000) + frame_bytes(8, 5)
    server.send(data[:100_000])
    started = time.monotonic()
    assert conn.read(0.2) is None
    assert time.monotonic() - started < 5
    server.send(data[100_000:150_000])
    assert conn.read(0.2) is None
    server.send(data[150_000:])
    check(conn.read(10), 7, 180_000)
    check(conn.read(10), 8, 5)


def _received_frames(server: ByteServer, count: int, timeout: float = 10.0) -> list[wire.Frame]:
    """The next `count` whole frames the client wrote (after its hello)."""
    assert server._accepted.wait(timeout) and server.peer is not None
    server.peer.settimeout(timeout)
    data = bytearray()
    frames: list[wire.Frame] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count and time.monotonic() < deadline:
        while len(data) >= 4:
            need = wire.frame_length(bytes(data[:4])) + 4
            if len(data) < need:
                break
            frames.append(wire.decode(bytes(data[:need])))
            del data[:need]
        if len(frames) < count:
            data += server.peer.recv(65536)
    return frames


def test_write_many_sends_every_frame_in_order_with_its_own_request_id(wire_pair):
    """Three requests (one with a body) in one call: each arrives whole, in order, under the id
    write_many returned for it, as a request (no response, push or one-way flag)."""
    server, conn = wire_pair
    frames = [wire.Frame(10, header={"i": 0}), wire.Frame(10, header={"i": 1}, body=b"body" * 100),
              wire.Frame(32, flags=wire.FLAG_RESPONSE | wire.FLAG_ONEWAY, header={"i": 2})]
    ids = conn.write_many(frames)
    got = _received_frames(server, 4)  # the hello, then the three
    assert [f.header for f in got] == [{"hello": 1}, {"i": 0}, {"i": 1}, {"i": 2}]
    assert [f.request_id for f in got[1:]] == ids and ids == [got[0].request_id + k for k in (1, 2, 3)]
    assert [f.code for f in got[1:]] == [10, 10, 32] and bytes(got[2].body) == b"body" * 100
    assert all(f.flags == 0 for f in got[1:])
    assert conn.write_many([]) == []


def test_write_many_with_one_frame_too_large_sends_none_of_them():
    server = ByteServer()
    conn = get_plugin_manager().transport("tcp").connect_blocking("127.0.0.1", server.port,
                                                                  TransportSettings(max_frame_size=4096))
    try:
        conn.write(wire.Frame(1, header={"hello": 1}))
        with pytest.raises(FrameTooLargeError):
            conn.write_many([wire.Frame(10, header={"i": 0}), wire.Frame(10, header={"i": 1}, body=b"x" * 8192)])
        conn.write(wire.Frame(1, header={"after": 1}))
        assert [f.header for f in _received_frames(server, 2)] == [{"hello": 1}, {"after": 1}]
    finally:
        conn.close()
        server.close()
