"""The loopback floor: what one request and its answer cost on this machine with no broker work,
so a single-send figure can be read against what the machine allows.

Not a peer but a bound. The server is a bare uvloop BufferedProtocol in its own process: it cuts
length-prefixed requests out of what it reads and answers each at once with a fixed answer; in
the flush=sync variant it first appends the request to a file and fdatasyncs it (the least a
durable answer costs: the file's length is set ahead of the writes, as the file store's commit
log sets it, so the fdatasync writes the data and no inode). The client is what `Producer.send`
does over a blocking connection when it sends back to back: one `sendall` of the request, non-blocking peeks for the answer (yielding
the vCPU between them) for up to the tcp plugin's ANSWER_SPIN_S (not with flush=sync, whose
answers come after an fsync: our client stops spinning there), then `recv_into` until the whole
answer is there. Requests and answers have the sizes of EQueue's SEND frame for a 100 B message
and its answer. Between requests the server waits as the broker does: it busy-polls after each
read (equeue_core/broker/busy_poll.py, at the broker's default `busy_poll_us`) before it sleeps.

A Python broker and a Python client doing real work cannot beat this round trip, so on this
machine EQueue's single sends reach at most `floor / Redis` times Redis's (bench/peers/run.py
prints that bound under the table, next to what the issue asks).

    python -m bench.peers.loopback_floor PORT (async|sync) FILE    # the server (run.py starts it)
"""

from __future__ import annotations

import os
import socket
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from equeue_plugins.store_file.constants import LENGTH_AHEAD

from bench.peers.common import ROOT, ServerProcess, chunks, free_port, missing_module, rate_row

SYSTEMS = ["loopback-floor"]
PRODUCE_MODES: list[str] = []
WORKLOADS = ("single",)  # no produce, consume or latency rows: run.py runs only these
SERVER_VARIANTS = [{"flush": "async"}, {"flush": "sync"}]

# EQueue's SEND frame for one 100 B message is ~220 bytes and its answer 88 (strace of a broker);
# the floor's request is the body plus this much, and its answer as long.
REQUEST_OVERHEAD = 120
ANSWER = b"\0" * 88
LENGTH = struct.Struct("<I")


def durability(system: str, opts: dict) -> str:
    return {"async": "none (answered at once)",
            "sync": "the request appended and fdatasync'ed before its answer"}[opts["flush"]]


def missing() -> str | None:
    return missing_module("uvloop")


@contextmanager
def server(tmp: Path, flush: str = "async") -> Iterator[dict]:
    port = free_port()
    srv = ServerProcess([sys.executable, "-m", "bench.peers.loopback_floor", str(port), flush,
                         str(tmp / "floor.log.data")], tmp / "floor.log", cwd=ROOT).start(port)
    try:
        yield {"port": port, "flush": flush, "server_pid": srv.pid}
    finally:
        srv.stop()


def single(info: dict, system: str, name: str, size: int, count: int, budget: float = 1e9) -> dict:
    import time

    from equeue_plugins.transport_tcp.blocking import ANSWER_SPIN_S, peeked, spin_until

    body = os.urandom(size + REQUEST_OVERHEAD - LENGTH.size)
    request = LENGTH.pack(len(body)) + body
    answer = bytearray(len(ANSWER))
    view = memoryview(answer)
    spin = ANSWER_SPIN_S if info.get("flush", "async") == "async" else 0.0
    with socket.create_connection(("127.0.0.1", info["port"])) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        arrived = peeked(sock, bytearray(1))

        def one() -> None:
            sock.sendall(request)
            if spin:
                spin_until(arrived, spin)  # the same wait as Producer.send's
            got = 0
            while got < len(answer):
                n = sock.recv_into(view[got:])
                if not n:
                    raise ConnectionError("the floor server closed the connection")
                got += n

        one()  # connection warm-up, not timed
        start = time.perf_counter()
        done = 0
        for n in chunks(count, budget, 50):
            for _ in range(n):
                one()
            done += n
        elapsed = time.perf_counter() - start
    return rate_row(done, elapsed)


def serve(port: int, flush: str, path: str) -> None:
    """Answer every length-prefixed request at once (after appending it to `path` and an
    fdatasync with flush=sync), until SIGTERM."""
    import asyncio
    import signal

    import uvloop

    from equeue_core.broker.busy_poll import BusyPoll
    from equeue_core.config import Config

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if flush == "sync" else -1
    file = {"end": 0, "length": 0}
    busy: list[BusyPoll] = []  # the broker's busy polling at its default window (set in main)

    class Floor(asyncio.BufferedProtocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            self.transport = transport
            self.buf = bytearray(1 << 16)
            self.end = 0
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def get_buffer(self, sizehint: int) -> memoryview:
            if self.end == len(self.buf):  # a new buffer, never a resize (a view of it may live on)
                grown = bytearray(2 * len(self.buf))
                grown[:self.end] = self.buf
                self.buf = grown
            return memoryview(self.buf)[self.end:]

        def buffer_updated(self, nbytes: int) -> None:
            busy[0].poke()
            self.end += nbytes
            start = 0
            while self.end - start >= LENGTH.size:
                n = LENGTH.size + LENGTH.unpack_from(self.buf, start)[0]
                if self.end - start < n:
                    break
                if fd >= 0:
                    end = file["end"] + n
                    if end > file["length"]:  # the length ahead of the writes (commit_log.py)
                        file["length"] = end + LENGTH_AHEAD
                        os.ftruncate(fd, file["length"])
                    os.write(fd, memoryview(self.buf)[start:start + n])
                    file["end"] = end
                    os.fdatasync(fd)
                self.transport.write(ANSWER)
                start += n
            if start:  # move the partial request that is left to the front (same length: no resize)
                self.buf[:self.end - start] = self.buf[start:self.end]
                self.end -= start

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        busy.append(BusyPoll(loop, Config().busy_poll_us / 1e6))
        srv = await loop.create_server(Floor, "127.0.0.1", port)
        await stop.wait()
        srv.close()

    uvloop.run(main())


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3])
