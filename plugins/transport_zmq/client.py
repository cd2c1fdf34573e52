"""The ZeroMQ client connection: a DEALER socket with many requests in flight, matched by id.

Guarantees (the same as the TCP client's):
- `request` assigns the request id, refuses an oversized frame with FrameTooLargeError before
  sending, and ends in exactly one of: the response frame (error-flagged responses are returned as
  Frames), RequestTimeoutError, ConnectionLostError.
- When ZeroMQ reports the TCP connection disconnected (socket monitor; this includes a server silent
  past the ZMTP heartbeat timeout), every request in flight fails with ConnectionLostError at once.
- ZeroMQ reconnects by itself; with ZMQ_IMMEDIATE nothing is queued for a dead connection, so a
  request made while disconnected waits (within its timeout) for the reconnect and then goes out:
  the next request after a server restart just works.
- A refused handshake (CURVE: a key the server does not allow, a wrong server key, CURVE on one
  side only) fails `connect`, and every request waiting for a reconnect, at once with
  HandshakeRefusedError naming the cause, instead of letting them wait out their timeout.
- `close()` closes the sockets with LINGER 0 and terminates the connection's own context.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable

import zmq
from equeue_plugins.transport_zmq import curve
from equeue_plugins.transport_zmq.parts import (
    FrameBatcher,
    parse_message,
    set_common_options,
)
from equeue_plugins.transport_zmq.pump import SocketPump
from zmq.utils.monitor import parse_monitor_message

from equeue_core import frame as wire
from equeue_core.contracts import TransportSettings
from equeue_core.errors import (
    ClientClosedError,
    ConnectionLostError,
    FrameTooLargeError,
    HandshakeRefusedError,
    ProtocolError,
    RequestTimeoutError,
    TransportError,
)
from equeue_core.push import deliver_push

log = logging.getLogger(__name__)

MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | curve.HANDSHAKE_FAILED


class ZmqClientConnection:
    """A `ClientConnection` over a ZeroMQ DEALER socket."""

    def __init__(self, host: str, port: int, settings: TransportSettings,
                 on_push: Callable[[wire.Frame], object] | None,
                 heartbeat_ivl: float, heartbeat_timeout: float) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.settings = settings
        self.on_push = on_push
        self._hb = (heartbeat_ivl, heartbeat_timeout)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._pump: SocketPump | None = None
        self._monitor_pump: SocketPump | None = None
        self._batcher: FrameBatcher | None = None
        self._push_tasks: set[asyncio.Task] = set()
        self._connected = asyncio.Event()
        self._refused = asyncio.Event()  # the latest handshake was refused (cleared by a good one)
        self._refusal: HandshakeRefusedError | None = None
        self._client_key: str | None = None  # our CURVE public key when CURVE is on
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close()` was called (a dropped connection is not closed: it reconnects)."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def connect(self) -> None:
        """Connect and wait for the ZMTP handshake; TransportError if it does not happen within
        connect_timeout (nothing is left open then)."""
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        set_common_options(sock, self.settings.socket_buffer, *self._hb)
        sock.setsockopt(zmq.ROUTING_ID, b"eq" + os.urandom(14))
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.CONNECT_TIMEOUT, max(1, int(self.settings.connect_timeout * 1000)))
        self._sock = sock
        try:
            self._client_key = curve.configure_client(sock, self.settings)
        except BaseException:
            await self._shutdown()
            raise
        self._monitor = sock.get_monitor_socket(MONITOR_EVENTS)
        self._monitor_pump = SocketPump(self._monitor, self._on_monitor_event)
        try:
            sock.connect(f"tcp://{self.host}:{self.port}")
            async with asyncio.timeout(self.settings.connect_timeout):
                await self._wait_ready()
        except BaseException as e:
            await self._shutdown()
            if isinstance(e, (TimeoutError, zmq.ZMQError)):
                raise TransportError(f"cannot connect to {self.address}: "
                                     f"{'no handshake within ' + str(self.settings.connect_timeout) + 's' if isinstance(e, TimeoutError) else e}") from None
            raise
        self._pump = SocketPump(sock, self._on_message_safe)
        self._batcher = FrameBatcher(self._send_message)

    # ------------------------------------------------------------ sending

    async def request(self, frame: wire.Frame, timeout: float) -> wire.Frame:
        """Send `frame` as a request and await its response (see the module docstring)."""
        request_id = next(self._ids)
        frame.request_id = request_id
        frame.flags &= ~(wire.FLAG_ONEWAY | wire.FLAG_RESPONSE | wire.FLAG_PUSH)
        buffers = wire.encode(frame, self.settings.max_frame_size)  # FrameTooLargeError: not sent
        batcher = self._batcher
        if self._closed or batcher is None:
            raise ClientClosedError(f"connection to {self.address} is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending[request_id] = fut
        timer = loop.call_later(timeout, _expire, fut, request_id, timeout)
        try:
            if not self._connected.is_set():
                # Wait for ZeroMQ's own reconnect (within this request's timeout). Sending before
                # the new handshake could put the frame on the old, dying pipe, where it would be
                # lost without a trace: the socket learns of the old pipe's end after the monitor.
                waiter = asyncio.ensure_future(self._wait_ready())
                await asyncio.wait((waiter, fut), return_when=asyncio.FIRST_COMPLETED)
                if not waiter.done():
                    waiter.cancel()
                    return await fut  # timed out or the connection was closed meanwhile
                waiter.result()  # HandshakeRefusedError: the reconnect was refused
                if self._batcher is None:
                    raise ClientClosedError(f"connection to {self.address} is closed")
                batcher = self._batcher
            batcher.write(None, buffers)  # leaves with this iteration's other frames
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(request_id, None)

    async def send_oneway(self, frame: wire.Frame) -> None:
        """Send `frame` with FLAG_ONEWAY. Waits (up to connect_timeout) while disconnected; then
        ConnectionLostError. Delivery after the send is best effort."""
        frame.request_id = next(self._ids)
        frame.flags = (frame.flags | wire.FLAG_ONEWAY) & ~(wire.FLAG_RESPONSE | wire.FLAG_PUSH)
        buffers = wire.encode(frame, self.settings.max_frame_size)
        batcher = self._batcher
        if self._closed or batcher is None:
            raise ClientClosedError(f"connection to {self.address} is closed")
        if not self._connected.is_set():  # wait for the reconnect (see request)
            try:
                async with asyncio.timeout(self.settings.connect_timeout):
                    await self._wait_ready()
            except TimeoutError:
                raise ConnectionLostError(f"not connected to {self.address}") from None
            if self._batcher is None:
                raise ClientClosedError(f"connection to {self.address} is closed")
            batcher = self._batcher
        batcher.write(None, buffers)

    async def _wait_ready(self) -> None:
        """Until a handshake succeeds; HandshakeRefusedError as soon as one is refused."""
        if self._connected.is_set():
            return
        if not self._refused.is_set():
            waiters = [asyncio.ensure_future(self._connected.wait()), asyncio.ensure_future(self._refused.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        refusal = self._refusal
        if not self._connected.is_set() and refusal is not None:
            raise HandshakeRefusedError(str(refusal), **refusal.details)  # a fresh one per caller

    # ------------------------------------------------------------ receiving

    def _on_message_safe(self, msg: list[zmq.Frame]) -> None:
        """One bad message must never end the receive loop (and with it every peer's service)."""
        try:
            self._on_message(msg)
        except Exception:
            log.exception("dropping a message that could not be handled")

    def _on_message(self, msg: list[zmq.Frame]) -> None:
        parse_message(msg, self.settings.max_frame_size, self._on_frame, self._on_bad_frame)

    def _on_bad_frame(self, head: tuple | None, e: ProtocolError) -> None:
        fut = self._pending.pop(head[6], None) if head is not None else None
        if fut is not None and not fut.done():
            cls = FrameTooLargeError if isinstance(e, FrameTooLargeError) else ProtocolError
            fut.set_exception(cls(f"response: {e}", **e.details))
        else:
            log.warning("dropping an unparseable message from %s: %s", self.address, e)

    def _send_message(self, identity: bytes | None, parts: list, copy: bool) -> None:
        if self._pump is None:
            return
        queued = self._pump.send(parts, copy)
        if queued is not None:  # lost the connection meanwhile: goes out after the reconnect
            queued.add_done_callback(_consume)

    def _on_frame(self, frame: wire.Frame) -> None:
        if frame.flags & wire.FLAG_PUSH:
            self._deliver_push(frame)
            return
        fut = self._pending.pop(frame.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(frame)

    def _on_monitor_event(self, msg: list[zmq.Frame]) -> None:
        event = parse_monitor_message([p.bytes for p in msg])
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._refusal = None
            self._refused.clear()
            self._connected.set()
        elif kind & curve.HANDSHAKE_FAILED:
            self._refusal = curve.describe_refusal(kind, int(event["value"]), self.address, self._client_key)
            self._refused.set()
        elif kind == zmq.EVENT_DISCONNECTED:
            self._connected.clear()
            refusal = self._refusal  # set: this connection never got past its handshake
            self._fail_pending(ConnectionLostError(f"connection to {self.address} lost") if refusal is None
                               else HandshakeRefusedError(str(refusal), **refusal.details))

    def _fail_pending(self, err: Exception) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)

    def _deliver_push(self, frame: wire.Frame) -> None:
        deliver_push(self.on_push, frame, self._push_tasks)

    # ------------------------------------------------------------ shutdown

    async def close(self) -> None:
        """Close for good: in-flight requests fail with ConnectionLostError, later ones raise
        ClientClosedError; sockets close with LINGER 0 and the context is terminated."""
        if self._closed:
            return
        self._closed = True
        if self._batcher is not None:
            self._batcher.flush()  # best effort: LINGER 0 may still drop what is unsent
        self._fail_pending(ConnectionLostError(f"connection to {self.address} closed"))
        for task in list(self._push_tasks):
            task.cancel()
        await asyncio.gather(*self._push_tasks, return_exceptions=True)
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._batcher is not None:
            self._batcher.discard()
            self._batcher = None
        for pump in (self._pump, self._monitor_pump):
            if pump is not None:
                pump.close()
        self._pump = self._monitor_pump = None
        self._connected.clear()
        if self._sock is not None:
            if self._monitor is not None:
                try:
                    self._sock.disable_monitor()
                except zmq.ZMQError:
                    pass
                self._monitor.close(linger=0)
                self._monitor = None
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _consume(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _expire(fut: asyncio.Future, request_id: int, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(RequestTimeoutError(f"no response to request {request_id} within {timeout}s",
                                              request_id=request_id, timeout=timeout))
