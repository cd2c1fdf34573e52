"""ZeroMQ-specific liveness: a peer that goes silent (frozen with SIGSTOP, so its sockets stay
open and nothing is ever closed) counts as gone after the ZMTP heartbeat timeout, on both ends.

TCP has no heartbeat of its own: a silent TCP peer shows up as RequestTimeoutError instead, which
the conformance kit covers for every transport.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from equeue_plugins.transport_zmq.plugin import ZmqTransport

from equeue_core.contracts import TransportSettings
from equeue_core.errors import ConnectionLostError
from equeue_core.frame import Frame

from .harness import ECHO, HOLD, ScriptedHandler, run, wait_until

PEER = str(Path(__file__).with_name("zmq_peer.py"))


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, PEER, *args], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    return proc, line


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.kill(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    proc.kill()
    proc.wait(10)
    if proc.stdout:
        proc.stdout.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_frozen_server_fails_inflight_requests_after_the_heartbeat_timeout(loop: str) -> None:
    proc, port = _start("server")
    try:
        assert port.isdigit(), port

        async def main() -> None:
            transport = ZmqTransport(heartbeat_interval=0.2, heartbeat_timeout=1.0)
            client = await transport.connect("127.0.0.1", int(port), TransportSettings())
            try:
                assert bytes((await client.request(Frame(ECHO, body=b"hi"), 5)).body) == b"hi"
                held = asyncio.ensure_future(client.request(Frame(HOLD), 60))
                await asyncio.sleep(0.2)
                os.kill(proc.pid, signal.SIGSTOP)
                started = time.monotonic()
                with pytest.raises(ConnectionLostError):
                    await asyncio.wait_for(held, 20)
                assert time.monotonic() - started < 10
            finally:
                await client.close()
        run(loop, main)
    finally:
        _stop(proc)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_frozen_client_is_reported_lost_after_the_heartbeat_timeout(loop: str) -> None:
    async def main() -> None:
        transport = ZmqTransport(heartbeat_interval=0.2, heartbeat_timeout=1.0)
        handler = ScriptedHandler()
        server = await transport.serve("127.0.0.1", 0, handler, TransportSettings())
        proc = None
        try:
            proc = await asyncio.to_thread(
                subprocess.Popen, [sys.executable, PEER, "client", str(server.address[1])],
                stdout=subprocess.PIPE, text=True)
            line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
            assert line.strip() == "ready"
            await wait_until(lambda: handler.holding == 1, what="the held request")
            assert len(server.connections) == 1
            os.kill(proc.pid, signal.SIGSTOP)
            await wait_until(lambda: len(handler.lost) == 1, timeout=20, what="connection_lost")
            assert len(server.connections) == 0
            await wait_until(lambda: handler.holding == 0, what="the held handler cancelled")
        finally:
            if proc is not None:
                await asyncio.to_thread(_stop, proc)
            await server.close()
    run(loop, main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_peer_that_reconnects_is_one_lost_and_one_new_connection(loop: str) -> None:
    """ZeroMQ drops a peer that sends a part over MAXMSGSIZE; the DEALER reconnects with the same
    identity, very likely on the same file descriptor number. The server must report the old
    connection lost exactly once and keep serving the new one (no late, spurious loss)."""
    async def main() -> None:
        transport = ZmqTransport(heartbeat_interval=0.2, heartbeat_timeout=1.0)
        handler = ScriptedHandler()
        limit = 1024 * 1024
        server = await transport.serve("127.0.0.1", 0, handler, TransportSettings(max_frame_size=limit))
        client = await transport.connect("127.0.0.1", server.address[1], TransportSettings())
        try:
            for round_ in range(3):
                assert (await client.request(Frame(ECHO, header={"r": round_}), 5)).header == {"r": round_}
                with pytest.raises(ConnectionLostError):
                    await client.request(Frame(ECHO, body=b"x" * (2 * limit)), 5)
                await wait_until(lambda r=round_: len(handler.lost) == r + 1, what="the drop reported")
                reply = await client.request(Frame(ECHO, header={"after": round_}), 5)
                assert reply.header == {"after": round_}
                held = asyncio.ensure_future(client.request(Frame(HOLD), 5))
                await wait_until(lambda: handler.holding == 1, what="a held request")
                await asyncio.sleep(0.3)  # a late disconnect event for the old connection would land here
                assert len(handler.lost) == round_ + 1
                assert len(server.connections) == 1
                handler.release.set()
                assert (await held).header == {"released": True}
                handler.release.clear()
        finally:
            handler.release.set()
            await client.close()
            await server.close()
    run(loop, main)
