"""Shared pieces of the transport conformance kit: a scripted handler and an event-loop runner.

The handler's behaviour is chosen by the request code, so each test says what it wants from the
server in the frame itself. Every wait here is bounded in time.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from equeue_core.contracts import ServerConnection, TransportSettings
from equeue_core.errors import ConnectionLostError, RequestTimeoutError
from equeue_core.frame import Frame
from equeue_core.plugins import get_plugin_manager
from tests.helpers.waiting import wait_until_async as wait_until  # noqa: F401  (the kit's name for it)

ECHO = 1  # response: same header, same body
SLEEP = 2  # sleeps header["seconds"], then answers
PUSH = 3  # pushes header["count"] frames to the caller, then answers
HOLD = 4  # waits on the handler's `release` event (or its cancellation), then answers
FAIL = 5  # raises

T = TypeVar("T")

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


ZMQ_CURVE = "zmq+curve"  # not a plugin: the zmq transport with CURVE keys in every setting


def transport_names() -> list[str]:
    names = get_plugin_manager().names("equeue_transports")
    return names + [ZMQ_CURVE] if "zmq" in names else names


def transport(name: str) -> Any:
    if name == ZMQ_CURVE:
        return _WithCurve(get_plugin_manager().transport("zmq"))
    t = get_plugin_manager().transport(name)
    return _WithTls(t) if name == "tls" else t


class _WithTls:
    """The `tls` transport with throw-away certificates in every server's and client's settings,
    so the whole kit runs over TLS exactly as over plain TCP."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name = inner.name

    async def serve(self, host: str, port: int, handler: Any, s: TransportSettings) -> Any:
        certs = _certs()
        return await self._inner.serve(host, port, handler, dataclasses.replace(
            s, tls_cert=str(certs.server_cert), tls_key=str(certs.server_key)))

    async def connect(self, host: str, port: int, s: TransportSettings, on_push: Any = None) -> Any:
        return await self._inner.connect(host, port, dataclasses.replace(s, tls_ca=str(_certs().ca)), on_push)


class _WithCurve:
    """The `zmq` transport with a CURVE server key, an allowed-keys file (so the ZAP handler answers
    every handshake) and an allowed client key pair in every server's and client's settings."""

    name = ZMQ_CURVE

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def serve(self, host: str, port: int, handler: Any, s: TransportSettings) -> Any:
        k = _curve_keys()
        return await self._inner.serve(host, port, handler, dataclasses.replace(
            s, curve_public_key=k["server_public"], curve_secret_key=k["server_secret"],
            curve_allowed_keys=k["allowed"]))

    async def connect(self, host: str, port: int, s: TransportSettings, on_push: Any = None) -> Any:
        k = _curve_keys()
        return await self._inner.connect(host, port, dataclasses.replace(
            s, curve_server_key=k["server_public"], curve_public_key=k["client_public"],
            curve_secret_key=k["client_secret"]), on_push)


@functools.cache
def _curve_keys() -> dict[str, str]:
    import zmq

    server_public, server_secret = (k.decode() for k in zmq.curve_keypair())
    client_public, client_secret = (k.decode() for k in zmq.curve_keypair())
    d = Path(tempfile.mkdtemp(prefix="equeue-conformance-curve-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "allowed.txt").write_text(f"# the kit's one client\n{client_public}\n")
    return {"server_public": server_public, "server_secret": server_secret, "client_public": client_public,
            "client_secret": client_secret, "allowed": str(d / "allowed.txt")}


@functools.cache
def _certs() -> Any:
    from tests.helpers.certs import make_certs

    d = Path(tempfile.mkdtemp(prefix="equeue-conformance-certs-"))
    atexit.register(shutil.rmtree, d, True)
    return make_certs(d)


class Restartable:
    """`async with Restartable(name) as r`: a server on 127.0.0.1:0 (`r.server`, `r.handler`) and a
    client connected to it (`r.client`), for a test that stops the server under the client and
    starts another on the same port (`await r.restart()`). The client and every server are closed
    on the way out."""

    def __init__(self, name: str) -> None:
        self.transport = transport(name)
        self.settings = settings(connect_timeout=5.0)
        self.handler = ScriptedHandler()
        self._servers: list[Any] = []

    async def __aenter__(self) -> Restartable:
        self.server = await self.transport.serve("127.0.0.1", 0, self.handler, self.settings)
        self._servers.append(self.server)
        self.port = self.server.address[1]
        self.client = await self.transport.connect("127.0.0.1", self.port, self.settings)
        return self

    async def restart(self, handler: Any = None) -> Any:
        """A new server on the same port (the test closed the old one), with its own handler."""
        server = await self.transport.serve("127.0.0.1", self.port, handler or ScriptedHandler(), self.settings)
        self._servers.append(server)
        return server

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        for server in reversed(self._servers):
            await server.close()


def offering(method: str) -> list[str]:
    """The transports whose client connections have the optional `method` (found by connecting)."""
    async def probe(name: str) -> bool:
        async with serving(name) as (_handler, _server, client):
            return callable(getattr(client, method, None))
    return [name for name in transport_names() if run("asyncio", lambda n=name: probe(n))]


def each_of(names: list[str]) -> Callable[[Any], Any]:
    """A decorator: run the test for every transport in `names`, on both event loops."""
    def each(test: Any) -> Any:
        return pytest.mark.parametrize("name", names)(pytest.mark.parametrize("loop", list(LOOPS))(test))
    return each


def run(loop_name: str, main: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """Run `main()` on a fresh loop of the given kind, bounded by `timeout` seconds."""
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await main()
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        return runner.run(bounded())


class ScriptedHandler:
    """A ServerHandler that does what the request code says and records what it saw."""

    def __init__(self) -> None:
        self.requests: list[Frame] = []
        self.oneway: list[Frame] = []
        self.lost: list[ServerConnection] = []
        self.connections: dict[int, ServerConnection] = {}
        self.release = asyncio.Event()
        self.holding = 0
        self.cancelled = 0

    def record(self, conn: ServerConnection, frame: Frame) -> bool:
        """Note the connection and the request; True for a one-way request (nothing to answer)."""
        self.connections[conn.id] = conn
        if frame.is_oneway:
            self.oneway.append(Frame(frame.code, frame.request_id, frame.flags, dict(frame.header),
                                     bytes(frame.body)))
            return True
        self.requests.append(frame)
        return False

    async def hold(self, frame: Frame) -> Frame:
        """Answer `frame` once `release` is set (counting holders and cancellations)."""
        self.holding += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.holding -= 1
        return frame.response({"released": True})

    async def handle(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        if self.record(conn, frame):
            return None
        if frame.code == ECHO:
            return frame.response(frame.header, frame.body)
        if frame.code == SLEEP:
            await asyncio.sleep(frame.header["seconds"])
            return frame.response({"slept": frame.header["seconds"]})
        if frame.code == PUSH:
            for i in range(frame.header["count"]):
                conn.push(Frame(PUSH, header={"n": i}, body=b"p" * i))
            return frame.response({"pushed": frame.header["count"]})
        if frame.code == HOLD:
            return await self.hold(frame)
        if frame.code == FAIL:
            raise RuntimeError("scripted failure")
        return frame.error_response("unknown_request", f"code {frame.code}")

    def connection_lost(self, conn: ServerConnection) -> None:
        self.lost.append(conn)
        self.connections.pop(conn.id, None)


async def request_once_reconnected(client: Any, frame: Frame, tries: int = 50) -> Frame:
    """`client.request(frame)` after a server went: the reconnect is transparent, but the first
    tries may race the drop (ConnectionLostError), so try again every 0.1 s, `tries` times."""
    for _ in range(tries - 1):
        try:
            return await client.request(frame, 5)
        except ConnectionLostError:
            await asyncio.sleep(0.1)
    return await client.request(frame, 5)


class OwnAnswers:
    """The answers of requests made with a callback (request_now, write_from_thread), each under
    its own index: `done_for(i)` is request i's callback, which records the answer's header "i" and
    body in `seen[i]`, fails on a second call, and notes the thread it ran on in `threads`."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, bytes]] = {}
        self.threads: set[int] = set()

    def done_for(self, i: int) -> Callable[[Any], None]:
        def done(request: Any) -> None:
            self.threads.add(threading.get_ident())
            assert i not in self.seen, f"done of {i} ran twice"
            frame = request.result()
            self.seen[i] = (frame.header["i"], bytes(frame.body))
        return done


async def timed_out_once(outcome: list[BaseException | None], started: float) -> None:
    """A callback request's outcome: one RequestTimeoutError, within 3 s of `started` (loop time;
    callback requests' deadlines are checked about once a second)."""
    loop = asyncio.get_running_loop()
    await wait_until(lambda: bool(outcome), timeout=5, what="the timeout")
    assert isinstance(outcome[0], RequestTimeoutError)
    assert loop.time() - started < 3.0
    await asyncio.sleep(0.1)
    assert len(outcome) == 1


async def lost_by_a_server_stop(r: Restartable, outcome: list[BaseException | None]) -> None:
    """Stop r's server while it holds the SLEEP request just written; its callback's outcome
    must be ConnectionLostError."""
    await wait_until(lambda: r.handler.requests and r.handler.requests[-1].code == SLEEP, what="the request")
    await r.server.close()
    await wait_until(lambda: bool(outcome), timeout=10, what="the failure")
    assert isinstance(outcome[0], ConnectionLostError)


def settings(**overrides: Any) -> TransportSettings:
    return TransportSettings(**overrides)


@contextlib.asynccontextmanager
async def serving(name: str, handler: Any = None, server_settings: TransportSettings | None = None,
                  on_push: Callable[[Any], Any] | None = None) -> AsyncIterator[tuple[Any, Any, Any]]:
    """A server on 127.0.0.1:0 and one client connected to it; both closed on the way out."""
    t = transport(name)
    handler = handler if handler is not None else ScriptedHandler()
    server = await t.serve("127.0.0.1", 0, handler, server_settings or settings())
    try:
        client = await t.connect("127.0.0.1", server.address[1], settings(), on_push=on_push)
        try:
            yield handler, server, client
        finally:
            await client.close()
    finally:
        await server.close()
