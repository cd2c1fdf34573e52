"""Clients cannot exhaust the broker: 50 connections that pipeline requests and never read their
responses keep the broker's memory within their byte budgets while a well-behaved client goes on
sending and consuming (a real broker process, on every transport).

Each hog pipelines 4000 requests (about 0.5 MB) and then waits without reading: what is under
test is what the broker does with their *responses* (about 2 GB worth per hog). An endless flood is
a different matter per transport: TCP stops reading the connection (tests/test_transport_hostile.py);
a ZeroMQ ROUTER cannot stop reading one peer, see docs/protocol.md "Limits per connection".
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from equeue_core import frame as wire
from equeue_core.client import Message, Producer
from equeue_core.codes import Code
from tests.conftest import installed
from tests.helpers.broker import BrokerProcess
from tests.helpers.consume import consume

MiB = 1024 * 1024
BUDGET = 1 * MiB  # max_connection_bytes for this broker
HOGS = 50
# Per connection beyond the budget's guarantee: ZeroMQ's own reply queue (SNDHWM = 2 messages of
# up to 512 KiB here), read buffers, socket and task objects.
PER_CONNECTION_OVERHEAD = 2 * MiB
SLACK = 64 * MiB  # allocator fragmentation, the bystander's own traffic


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def pipelined_requests(n: int) -> bytes:
    """Pulls answered at once with 32 bodies of 16 KiB (512 KiB each), and topic lookups."""
    out = bytearray()
    for i in range(1, n + 1):
        if i % 4:
            f = wire.Frame(Code.PULL, i, 0, {"group": "hog", "topic": "big", "queue_id": i % 4,
                                             "offset": 0, "max_count": 32, "hold_ms": 0})
        else:
            f = wire.Frame(Code.QUEUE_RANGES, i, 0, {"topic": "big"})
        out += wire.encode_bytes(f)
    return bytes(out)


class TcpHog:
    """A raw TCP client that writes requests as fast as the broker reads them and never reads."""

    def __init__(self, port: int, requests: bytes) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.sock.setblocking(False)
        self.data = memoryview(requests)
        self.sent = 0

    def pump(self) -> None:
        while self.sent < len(self.data):
            try:
                n = self.sock.send(self.data[self.sent:self.sent + 65536])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # the broker closed us: what we did to it is what counts
            self.sent += n

    def close(self) -> None:
        self.sock.close()


class ZmqHog:
    """A raw DEALER that sends requests and never receives (its receive queue holds one message)."""

    def __init__(self, ctx, port: int, requests: bytes) -> None:
        import zmq

        self.zmq = zmq
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.RCVHWM, 1)
        self.sock.setsockopt(zmq.RCVBUF, 64 * 1024)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        self.chunks = frame_aligned_chunks(requests, 16 * 1024)
        self.next = 0

    def pump(self) -> None:
        # Each message holds whole frames (cut at frame boundaries, see frame_aligned_chunks).
        while self.next < len(self.chunks):
            try:
                self.sock.send(self.chunks[self.next], self.zmq.NOBLOCK)
            except self.zmq.Again:
                return
            self.next += 1

    def close(self) -> None:
        self.sock.close(linger=0)


def frame_aligned_chunks(requests: bytes, size: int) -> list[bytes]:
    out, start, off = [], 0, 0
    while off < len(requests):
        n = int.from_bytes(requests[off:off + 4], "little") + 4
        if off + n - start > size and off > start:
            out.append(requests[start:off])
            start = off
        off += n
    out.append(requests[start:])
    return out


@pytest.mark.slow
# tls is left out: the hogs speak raw frames on plain sockets (tls shares the tcp server's budget)
@pytest.mark.parametrize("transport", [t for t in installed("equeue_transports") if t != "tls"])
def test_fifty_connections_that_never_read_stay_within_their_byte_budgets(tmp_path, transport):
    """Bound: the broker's RSS at the start (topic written, one pull served) + 50 x (2 x budget,
    which equeue_core.admission guarantees per connection, + 2 MiB per connection of fixed cost)
    + 64 MiB slack = baseline + 264 MiB with the 1 MiB budget. Before the limits the TCP server
    held up to 4096 answered pulls of 512 KiB per connection (GiBs) and ZeroMQ had no limit."""
    b = BrokerProcess(tmp_path / "data", transport=transport,
                      env={"EQUEUE_MAX_CONNECTION_BYTES": str(BUDGET)}).start()
    hogs: list = []
    ctx = None
    try:
        with Producer(b.address) as p:
            for q in range(4):
                p.send_batch([Message("big", bytes([q]) * 16 * 1024) for _ in range(32)], routing_key=None)
        first = consume(b.address, "warm", "big", 128, timeout=60)
        assert len(first.items) >= 128
        pid = b.proc.pid
        baseline = rss(pid)
        bound = baseline + HOGS * (2 * BUDGET + PER_CONNECTION_OVERHEAD) + SLACK
        requests = pipelined_requests(4000)
        if transport == "zmq":
            import zmq

            ctx = zmq.Context()
            hogs = [ZmqHog(ctx, b.port, requests) for _ in range(HOGS)]
        else:
            hogs = [TcpHog(b.port, requests) for _ in range(HOGS)]

        bystander: dict = {}

        def behave() -> None:
            try:
                with Producer(b.address) as bp:
                    for i in range(200):
                        bp.send(Message("calm", f"c{i}".encode()))
                col = consume(b.address, "calm-group", "calm", 200, timeout=120)
                bystander["got"] = len(col.items)
            except Exception as e:  # reported below
                bystander["error"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=behave)
        t.start()
        peak = baseline
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and (t.is_alive() or time.monotonic() < deadline - 140):
            for h in hogs:
                h.pump()
            peak = max(peak, rss(pid))
            assert peak <= bound, (f"broker RSS {peak / MiB:.0f} MiB is over the bound {bound / MiB:.0f} MiB "
                                   f"(baseline {baseline / MiB:.0f} MiB)")
            time.sleep(0.05)
        t.join(30)
        print(f"{transport}: baseline {baseline / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB, "
              f"bound {bound / MiB:.1f} MiB")
        assert bystander.get("got") == 200, bystander
        assert b.proc.poll() is None, "the broker died"
        for h in hogs:  # the hogs hang up with replies pending: the broker must not mind
            h.close()
        hogs = []
        time.sleep(1.0)
        assert b.proc.poll() is None, "the broker died when the hogs hung up"
    finally:
        for h in hogs:
            h.close()
        if ctx is not None:
            ctx.term()
        b.kill()


@pytest.mark.parametrize("transport", installed("equeue_transports"))
def test_client_over_max_connections_gets_one_clear_error_and_the_others_keep_working(tmp_path, transport):
    from equeue_core.client import AdminClient
    from equeue_core.errors import TooManyConnectionsError

    b = BrokerProcess(tmp_path / "data", transport=transport, env={"EQUEUE_MAX_CONNECTIONS": "2"}).start()
    admins = []
    try:
        for _ in range(2):
            admins.append(AdminClient(b.address))
            admins[-1].create_topic("first", 1)  # connected and answered
        with pytest.raises(TooManyConnectionsError) as refused:
            with Producer(b.address) as p:
                p.send(Message("x", b"never"))
        line = str(refused.value)
        assert "limit of 2 connections" in line and "\n" not in line
        for a in admins:  # the admitted ones are untouched
            a.create_topic("kept", 2)
            assert len(a.queue_ranges("kept")) == 2
    finally:
        for a in admins:
            a.close()
        b.stop()
