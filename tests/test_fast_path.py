"""The servers' fast path (contracts.ImmediateServerHandler): requests the broker can answer
without waiting (a send with flush=async, a pull that finds records, commits, routes) are answered
in the read callback, without a task. These tests pin what it must not change: arrival order per
connection across both paths, answers in request order, and the per-connection byte budget
(a flood of such requests over the budget is still answered in full, never wedged).

Raw frames on a plain socket (or a raw ZeroMQ DEALER) against a real broker process: the client
library would hide the pipelining under test.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from equeue_core import frame as wire
from equeue_core.client.message import Message
from equeue_core.codes import Code, PullStatus
from tests.helpers.broker import BrokerProcess

READ_TIMEOUT = 60.0  # generous: the machine may be loaded; a wedge never answers at all


def read_frames(sock: socket.socket, count: int, timeout: float = READ_TIMEOUT) -> list[wire.Frame]:
    """Read `count` whole frames (bounded in time: an AssertionError when they do not come)."""
    sock.settimeout(timeout)
    buf = bytearray()
    frames: list[wire.Frame] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count:
        assert time.monotonic() < deadline, f"only {len(frames)} of {count} answers in {timeout}s"
        while len(buf) >= 4:
            need = int.from_bytes(buf[:4], "little") + 4
            if len(buf) < need:
                break
            frames.append(wire.decode(bytes(buf[:need])))
            del buf[:need]
        if len(frames) >= count:
            break
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            raise AssertionError(f"only {len(frames)} of {count} answers in {timeout}s") from None
        assert chunk, f"the broker closed the connection after {len(frames)} of {count} answers"
        buf += chunk
    return frames


def send_frame(request_id: int, topic: str, queue_id: int, body: bytes) -> bytes:
    return wire.encode_bytes(wire.Frame(Code.SEND, request_id, 0, {"topic": topic, "queue_id": queue_id},
                                        body))


def test_a_send_pipelined_behind_a_create_topic_sees_the_topic_that_request_created(tmp_path: Path):
    """CREATE_TOPIC has no fast path (a task), SEND has: sent in one write, the send must still
    run after the create (it is answered queue_not_found for queue 3 of a 1-queue topic). A
    send that overtook the create would auto-create the topic with the default 4 queues and be
    stored in queue 3."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with socket.create_connection(("127.0.0.1", b.port)) as sock:
            create = wire.encode_bytes(wire.Frame(Code.CREATE_TOPIC, 1, 0, {"topic": "ordered", "queues": 1}))
            sock.sendall(create + send_frame(2, "ordered", 3, Message("ordered", b"x").encode(3)))
            answers = {f.request_id: f for f in read_frames(sock, 2)}
        assert not answers[1].is_error, answers[1].header
        assert answers[1].header["queues"] == 1
        assert answers[2].is_error, f"the send overtook the create: {answers[2].header}"
        assert answers[2].header["error"] == "queue_not_found"
    finally:
        b.stop()


def test_sends_pipelined_on_one_connection_are_stored_and_answered_in_request_order(tmp_path: Path):
    n = 500
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with socket.create_connection(("127.0.0.1", b.port)) as sock:
            body = Message("inorder", b"y" * 100).encode(0)
            sock.sendall(b"".join(send_frame(i + 1, "inorder", 0, body) for i in range(n)))
            answers = read_frames(sock, n)
            assert [f.request_id for f in answers] == list(range(1, n + 1))
            assert all(not f.is_error for f in answers), answers[0].header
            assert [f.header["first_offset"] for f in answers] == list(range(n))
            # and a pull (fast path too when it finds records) sees them in that order
            pull = wire.Frame(Code.PULL, n + 1, 0, {"group": "g", "topic": "inorder", "queue_id": 0,
                                                    "offset": 0, "max_count": 1000, "hold_ms": 0})
            sock.sendall(wire.encode_bytes(pull))
            (answer,) = read_frames(sock, 1)
            assert answer.header["status"] == PullStatus.FOUND
            assert answer.header["count"] == n and answer.header["next_offset"] == n
    finally:
        b.stop()


def test_a_pipelined_flood_of_pulls_whose_answers_outgrow_the_budget_is_answered_in_full(tmp_path: Path):
    """4000 pulls written at once, each answered at once with a 2 KB record, to a broker whose
    per-connection budget is 16 KiB, the client reading all the while. One read of requests
    (16 KiB, about 90 pulls) answers past the budget: the broker stops starting requests and
    stops reading the connection, and must start again once its answers have gone to the kernel
    -- no handler task is left running whose end would do it, and the kernel taking everything
    means no resume_writing either."""
    n = 4000
    b = BrokerProcess(tmp_path / "data", env={"EQUEUE_MAX_CONNECTION_BYTES": str(16 * 1024)}).start()
    try:
        with socket.create_connection(("127.0.0.1", b.port)) as sock:
            sock.sendall(send_frame(1, "flood", 0, Message("flood", b"z" * 2000).encode(0)))
            (stored,) = read_frames(sock, 1)
            assert not stored.is_error, stored.header
            pulls = b"".join(wire.encode_bytes(wire.Frame(
                Code.PULL, i + 2, 0, {"group": "g", "topic": "flood", "queue_id": 0, "offset": 0,
                                      "max_count": 1, "hold_ms": 0})) for i in range(n))
            writer = threading.Thread(target=sock.sendall, args=(pulls,), daemon=True)
            writer.start()
            answers = read_frames(sock, n)
            writer.join(READ_TIMEOUT)
            assert not writer.is_alive()
        assert [f.request_id for f in answers] == list(range(2, n + 2))
        assert all(f.header.get("count") == 1 for f in answers), answers[0].header
    finally:
        b.stop()


def test_zmq_peer_whose_one_message_of_pulls_outgrows_the_budget_is_answered_in_full(tmp_path: Path):
    """The ZeroMQ server's fast path: one message of 40 pulls, each answered at once with a 2 KB
    record, to a broker whose per-connection budget is 64 KiB. The answers pass the budget
    inside that message, so the last pulls wait; no handler task is left running, so the server
    itself must look again once the iteration's replies have gone to ZeroMQ (the peer sends
    nothing more that could)."""
    import zmq

    n = 40
    b = BrokerProcess(tmp_path / "data", transport="zmq",
                      env={"EQUEUE_MAX_CONNECTION_BYTES": str(64 * 1024)}).start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{b.port}")
        sock.send(send_frame(1, "zflood", 0, Message("zflood", b"z" * 2000).encode(0)))
        pulls = b"".join(wire.encode_bytes(wire.Frame(
            Code.PULL, i + 2, 0, {"group": "g", "topic": "zflood", "queue_id": 0, "offset": 0,
                                  "max_count": 1, "hold_ms": 0})) for i in range(n))
        answers: list[wire.Frame] = []
        deadline = time.monotonic() + READ_TIMEOUT
        sent = False
        while len(answers) < n + 1:
            if sock.poll(100, zmq.POLLIN):
                data = sock.recv()
                off = 0
                while off < len(data):
                    need = int.from_bytes(data[off:off + 4], "little") + 4
                    answers.append(wire.decode(data[off:off + need]))
                    off += need
            if answers and not sent:
                assert not answers[0].is_error, answers[0].header
                sock.send(pulls)  # one message, 40 frames
                sent = True
            assert time.monotonic() < deadline, f"only {len(answers) - 1} of {n} pulls answered"
        assert [f.request_id for f in answers[1:]] == list(range(2, n + 2))
        assert all(f.header.get("count") == 1 for f in answers[1:]), answers[1].header
    finally:
        sock.close(linger=0)
        ctx.term()
        b.stop()
