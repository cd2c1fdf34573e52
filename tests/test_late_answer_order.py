"""The order in which the broker hands a send's acknowledgement and the held pulls that send woke
to the kernel, read from the outside: the broker runs under strace and the test decodes the frames
of every socket write. A send that wakes pulls on at most LATE_FIRST_MAX connections lets their
answers go first (a consumer's wake-up is the end-to-end latency); one that wakes more sends its
acknowledgement first (a producer's latency must not grow with the consumers waiting)."""

from __future__ import annotations

import shutil
import socket
import time

from equeue_plugins.transport_tcp.server import LATE_FIRST_MAX

from equeue_core import frame as wire
from equeue_core.client.message import Message
from equeue_core.codes import Code, PullStatus
from tests.helpers.broker import BrokerProcess
from tests.test_durability_strace import HEX, fd_of, parse, unhex
from tests.test_fast_path import read_frames, send_frame

TOPIC = "order"


def _request(code: int, request_id: int, header: dict) -> bytes:
    return wire.encode_bytes(wire.Frame(code, request_id, 0, header))


def _held_pulls(info: socket.socket) -> int:
    info.sendall(_request(Code.BROKER_INFO, 99, {}))
    return read_frames(info, 1)[0].header["held_pulls"]


def _wake(port: int, info: socket.socket, producer: socket.socket, pullers: int, offset: int,
          send_id: int) -> list[int]:
    """Hold `pullers` pulls at `offset` (one connection each, request ids 1000+i), then send one
    message that stores at `offset`. Returns the pull request ids (every answer read)."""
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(pullers)]
    try:
        ids = [1000 + offset * 10 + i for i in range(pullers)]
        for conn, rid in zip(conns, ids, strict=True):
            conn.sendall(_request(Code.PULL, rid, {"topic": TOPIC, "queue_id": 0, "offset": offset,
                                                   "max_count": 8, "hold_ms": 30000}))
        deadline = time.monotonic() + 30
        while _held_pulls(info) != pullers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _held_pulls(info) == pullers
        producer.sendall(send_frame(send_id, TOPIC, 0, Message(TOPIC, b"x").encode(0)))
        ack = read_frames(producer, 1)[0]
        assert ack.request_id == send_id and not ack.is_error and ack.header["first_offset"] == offset
        for conn, rid in zip(conns, ids, strict=True):
            answer = read_frames(conn, 1)[0]
            assert answer.request_id == rid and answer.header["status"] == PullStatus.FOUND
        return ids
    finally:
        for conn in conns:
            conn.close()


def _socket_writes(trace) -> list[list[tuple[int, int]]]:
    """Each socket write of the broker, in start order, as the (code, request id) of the response
    frames it carries."""
    sockets: set[int] = set()
    writes = []
    for c in parse(trace):
        if c.name in ("accept", "accept4") and c.result >= 0:
            sockets.add(c.result)
        elif c.name == "close":
            sockets.discard(fd_of(c))
        elif c.name in ("write", "writev", "sendto", "sendmsg") and c.result > 0 and fd_of(c) in sockets:
            buf = b"".join(unhex(s) for s in HEX.findall(c.args))
            frames, at = [], 0
            while at + wire.HEAD_SIZE <= len(buf):
                length, _magic, _ver, code, flags, _r, rid, _hlen = wire.HEAD.unpack_from(buf, at)
                if flags & wire.FLAG_RESPONSE:
                    frames.append((code, rid))
                at += length + wire.LENGTH_SIZE
            writes.append(frames)
    return writes


def _write_index(writes: list[list[tuple[int, int]]], code: int, rid: int) -> int:
    found = [i for i, frames in enumerate(writes) if (code, rid) in frames]
    assert len(found) == 1, f"answer {code}/{rid} in {len(found)} socket writes"
    return found[0]


def test_a_send_lets_a_few_woken_pulls_go_first_and_goes_before_many(tmp_path):
    strace = shutil.which("strace")
    assert strace, "strace is missing: `make system-deps` installs it (Makefile DEBIAN_TEST_PACKAGES)"
    trace = tmp_path / "trace.txt"
    b = BrokerProcess(tmp_path / "data", prefix=[strace, "-f", "-tt", "-T", "-xx", "-s", "4096", "-o", str(trace),
                                                 "-e", "trace=accept,accept4,close,write,writev,sendto,sendmsg"])
    b.start(timeout=120)
    try:
        with socket.create_connection(("127.0.0.1", b.port)) as info, \
                socket.create_connection(("127.0.0.1", b.port)) as producer:
            info.sendall(_request(Code.CREATE_TOPIC, 1, {"topic": TOPIC, "queues": 1}))
            assert not read_frames(info, 1)[0].is_error
            few = _wake(b.port, info, producer, 1, 0, 11)
            many = _wake(b.port, info, producer, LATE_FIRST_MAX + 1, 1, 12)
    finally:
        b.stop()
    writes = _socket_writes(trace)
    ack = _write_index(writes, Code.SEND, 11)
    assert all(_write_index(writes, Code.PULL, rid) < ack for rid in few)
    ack = _write_index(writes, Code.SEND, 12)
    assert all(_write_index(writes, Code.PULL, rid) > ack for rid in many)
