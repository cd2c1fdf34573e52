"""The TCP client connection: many requests in flight, matched to responses by request id.

Guarantees:
- `request` assigns the request id, refuses an oversized frame with FrameTooLargeError before
  anything is written, and ends in exactly one of: the response frame (an error-flagged response is
  returned as a Frame; the caller maps it), RequestTimeoutError, ConnectionLostError.
- When the connection drops, every request in flight fails with ConnectionLostError at once.
- The next request after a drop (server restart, network blip) reconnects transparently; if that
  reconnect fails, the request fails with ConnectionLostError and the one after tries again.
- Push frames from the server go to `on_push` (a coroutine result is run as a task).
- `request_now` (the loop thread) and `write_from_thread` (any other thread) end the same way,
  in a callback instead of an awaited result: `done(request)` runs exactly once, on the loop
  thread, with the response, RequestTimeoutError (deadlines checked about once a second) or
  ConnectionLostError.
- Writes are never copied here: `frame.encode` buffers go to `writelines` as they are, one call
  per event-loop iteration (framing.WriteCoalescer).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable

from equeue_plugins.transport_tcp.framing import (
    FrameReader,
    Head,
    SpareBodies,
    WriteCoalescer,
    duplicate_socket,
)
from equeue_plugins.transport_tcp.server import resolve, tune_socket

from equeue_core import frame as wire
from equeue_core.contracts import TransportSettings
from equeue_core.errors import (
    ClientClosedError,
    ConnectionLostError,
    EQueueError,
    FrameTooLargeError,
    ProtocolError,
    RequestTimeoutError,
    TransportError,
    error_for_code,
)
from equeue_core.push import deliver_push

log = logging.getLogger(__name__)

# Received bodies a connection keeps to receive its next large answers into (framing.SpareBodies):
# enough for a push Consumer's pulls in flight while it catches up (16 queues, two pulls each)
SPARE_BODIES = 32
SPARE_BODY_BYTES = 32 * 1024 * 1024
RECONNECT_EVERY_S = 0.5  # write_from_thread reconnects a dropped connection at most this often


class _ClientProtocol(asyncio.BufferedProtocol):
    """One TCP connection's worth of state; replaced by a new one on reconnect."""

    def __init__(self, owner: TcpClientConnection) -> None:
        self._owner = owner
        self.pending: dict[int, asyncio.Future] = {}
        self.transport: asyncio.Transport | None = None
        self.writer: WriteCoalescer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # set by connection_made
        self.lost = False
        self.write_paused = False
        self._resumed: asyncio.Future | None = None
        # writers waiting for their turn (write_turn), in arrival order behind _write_order
        self.queued_writes = 0
        self._write_order = asyncio.Lock()
        self.refusal: EQueueError | None = None  # why the server closed us, if it said so
        self.received = False  # any bytes from the server yet
        self.reader = FrameReader(owner.settings.max_frame_size, self._on_frame, self._on_oversized,
                                  self._on_bad_frame, self._on_fatal,
                                  SpareBodies(SPARE_BODIES, SPARE_BODY_BYTES))
        # write_from_thread: a duplicate of the socket that callers' threads write on (under the
        # owner's _thread_lock), closed when the connection is lost
        self.thread_sock: socket.socket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # the loop this connection lives on, kept: CPython 3.11's asyncio.get_running_loop()
        # makes a getpid() system call, and every request needs the loop
        self.loop = asyncio.get_running_loop()
        # large flushes with the GIL released (WriteCoalescer), on a plain connection only
        self.writer = WriteCoalescer(transport, self.loop, direct=self._owner._tls is None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.received = True
        self.reader.feed(nbytes)

    def _tls_hint(self) -> str:
        """A TLS server that requires a client certificate closes right after the handshake
        (TLS 1.3 sends its alert after the client has finished): say so when that fits."""
        owner = self._owner
        if owner._tls is None or self.received or owner.settings.tls_cert:
            return ""
        return ("; closed by the server before any answer: a broker with mutual TLS requires a client "
                "certificate (tls_cert/tls_key, EQUEUE_TLS_CERT/EQUEUE_TLS_KEY)")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.writer is not None:
            self.writer.close_direct()
        if self.thread_sock is not None:
            with self._owner._thread_lock:
                self.thread_sock.close()
                self.thread_sock = None
        pending, self.pending = self.pending, {}
        err = self.refusal or ConnectionLostError(f"connection to {self._owner.address} lost"
                                                  + (f": {exc}" if exc else "") + self._tls_hint())
        self.refusal = err  # a later request on this protocol says why too (e.g. a TLS alert)
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self._resumed = None

    async def drain(self) -> None:
        """Wait while the kernel send buffer is full (bounded memory when the server is slow)."""
        if self.write_paused and not self.lost:
            if self._resumed is None:
                self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed

    def must_wait(self) -> bool:
        """Whether a writer must take write_turn: the buffer is full, or others wait already."""
        return self.write_paused or self.queued_writes > 0

    async def write_turn(self) -> None:
        """Return when this writer may write: after every writer that waited before it, and
        with room in the send buffer (or the connection lost: the caller checks). The caller
        writes before its next await, so writes leave in the order writers arrived. Why: a
        writer that waited for a drain used to be overtaken by one that came after the drain
        and found room, and a producer's batches of one queue were stored out of order."""
        self.queued_writes += 1
        try:
            async with self._write_order:
                while self.write_paused and not self.lost:
                    await self.drain()
        finally:
            self.queued_writes -= 1

    def _on_frame(self, frame: wire.Frame) -> None:
        if frame.flags & wire.FLAG_PUSH:
            self._owner._deliver_push(frame)
            return
        if frame.request_id == 0 and frame.is_error:
            # The server refuses this connection (e.g. too_many_connections) and closes it:
            # that error, not a bare "connection lost", is what the requests in flight get.
            h = frame.header if isinstance(frame.header, dict) else {}
            details = h.get("details") if isinstance(h.get("details"), dict) else {}
            code = str(h.get("error", "transport"))
            self.refusal = error_for_code(code)(
                f"{self._owner.address}: {h.get('message', code)}", **details)
            log.warning("%s", self.refusal)
            return
        fut = self.pending.pop(frame.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(frame)
        # else: a response to a request that already timed out; drop it.

    def _on_oversized(self, head: Head, err: FrameTooLargeError) -> None:
        fut = self.pending.pop(head[6], None)
        if fut is not None and not fut.done():
            fut.set_exception(FrameTooLargeError(f"response {err}", **err.details))

    def _on_bad_frame(self, head: Head, err: ProtocolError) -> None:
        fut = self.pending.pop(head[6], None)
        if fut is not None and not fut.done():
            fut.set_exception(ProtocolError(f"response does not decode: {err}"))

    def _on_fatal(self, err: ProtocolError) -> None:
        log.warning("closing connection to %s: %s", self._owner.address, err)
        if self.transport is not None:
            self.transport.abort()


class TcpClientConnection:
    """A `ClientConnection` over TCP that reconnects on the next request after a drop."""

    def __init__(self, host: str, port: int, settings: TransportSettings,
                 on_push: Callable[[wire.Frame], object] | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self._tls = tls
        self.port = port
        self.address = f"{host}:{port}"
        self.settings = settings
        self.on_push = on_push
        self._ids = itertools.count(1)
        self._proto: _ClientProtocol | None = None
        self._connecting: asyncio.Future | None = None
        self._closed = False
        self._push_tasks: set[asyncio.Task] = set()
        self._thread_lock = threading.Lock()  # write_from_thread's writers, and _deadlines
        # the callback requests in flight (request_now, write_from_thread): request id -> deadline
        self._deadlines: dict[int, float] = {}
        self._deadline_watch: asyncio.TimerHandle | None = None
        self._thread_reconnect = 0.0  # time.monotonic() of write_from_thread's last reconnect

    @property
    def closed(self) -> bool:
        """True once `close()` was called (a dropped connection is not closed: it reconnects)."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._proto is not None and not self._proto.lost

    async def connect(self) -> None:
        """Open the TCP connection (TransportError if that fails within connect_timeout)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                family, sockaddr = await resolve(self.host, self.port)
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    tune_socket(sock, self.settings.socket_buffer)  # before connect: window scaling
                    sock.setblocking(False)
                    await loop.sock_connect(sock, sockaddr)
                    tls_args = {} if self._tls is None else {
                        "ssl": self._tls, "server_hostname": self.host,
                        "ssl_handshake_timeout": self.settings.connect_timeout}
                    _, protocol = await loop.create_connection(lambda: _ClientProtocol(self), sock=sock,
                                                               **tls_args)
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError:
            hint = " (is it a plaintext port? use tcp://)" if self._tls is not None else ""
            raise TransportError(f"connect to {self.address} timed out after "
                                 f"{self.settings.connect_timeout}s{hint}") from None
        except OSError as e:
            raise TransportError(f"cannot connect to {self.address}: {e}") from None
        self._proto = protocol

    async def _ready(self) -> _ClientProtocol:
        proto = self._proto
        if proto is not None and not proto.lost:
            return proto
        if self._closed:
            raise ClientClosedError(f"connection to {self.address} is closed")
        # One reconnect at a time; concurrent requests wait for it.
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self.connect())
        connecting = self._connecting
        try:
            await asyncio.shield(connecting)
        except TransportError as e:
            raise ConnectionLostError(f"connection to {self.address} lost and reconnect failed: {e}") from None
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        if self._closed:
            self._drop()
            raise ClientClosedError(f"connection to {self.address} is closed")
        assert self._proto is not None
        return self._proto

    async def request(self, frame: wire.Frame, timeout: float) -> wire.Frame:
        """Send `frame` as a request and await its response (see the module docstring)."""
        request_id = next(self._ids)
        frame.request_id = request_id
        frame.flags &= ~(wire.FLAG_ONEWAY | wire.FLAG_RESPONSE | wire.FLAG_PUSH)
        buffers = wire.encode(frame, self.settings.max_frame_size)  # FrameTooLargeError: nothing sent
        proto = self._proto
        if proto is None or proto.lost:
            proto = await self._ready()
        if proto.must_wait():
            await proto.write_turn()
        if proto.lost:  # dropped (or refused by the server) before we could write
            raise proto.refusal or ConnectionLostError(f"connection to {self.address} lost")
        loop = proto.loop
        fut = loop.create_future()
        proto.pending[request_id] = fut
        timer = loop.call_later(timeout, _expire, fut, request_id, timeout)
        try:
            assert proto.writer is not None
            proto.writer.write(buffers)
            return await fut
        finally:
            timer.cancel()
            proto.pending.pop(request_id, None)

    def request_now(self, code: int, header: bytes, body: bytes, timeout: float,
                    done: Callable[[_CallbackRequest], object]) -> bool:
        """On the loop thread: write one request in this call, its header map already encoded
        (frame.encode_header). `done(request)` then runs once on the loop thread, in the callback
        that read the answer or saw the failure: `request.result()` is the response frame,
        `request.exception()` RequestTimeoutError (checked about once a second),
        ConnectionLostError, or None.

        Why not `request`: its answer wakes the awaiting task one loop turn later, and that
        task's own waiter a turn after that. While another thread of the process holds the GIL
        (a producer's busy caller), every turn waits for a GIL switch; a producer's batch took
        three turns from its answer to its next batch's write (docs/benchmarks.md, "`send_async`:
        answers in the callback that reads them").

        False, nothing written and `done` never called, when `request` would have to wait: the
        connection is closed, not connected (this does not reconnect), or other writers wait
        for their turn (`must_wait`: this write would overtake theirs); the caller then uses
        `request`. FrameTooLargeError: nothing written."""
        proto = self._proto
        if self._closed or proto is None or proto.lost or proto.writer is None or proto.must_wait():
            return False
        request_id = next(self._ids)
        buffers = wire.encode_parts(code, request_id, 0, header, body, self.settings.max_frame_size)
        proto.pending[request_id] = _CallbackRequest(done)  # type: ignore[assignment]
        with self._thread_lock:
            self._set_deadline(proto.loop, request_id, timeout)
        proto.writer.write(buffers)
        return True

    def _set_deadline(self, loop: asyncio.AbstractEventLoop, request_id: int, timeout: float) -> None:
        """With _thread_lock held: a callback request's deadline, and the watch that enforces it."""
        self._deadlines[request_id] = time.monotonic() + timeout
        if self._deadline_watch is None:
            self._deadline_watch = loop.call_soon_threadsafe(self._expire_callback_requests)  # type: ignore[assignment]

    @property
    def thread_writable(self) -> bool:
        """Whether write_from_thread can write at all: not over TLS (the TLS layer lives on the
        loop thread), where it refuses every write."""
        return self._tls is None

    def write_from_thread(self, loop: asyncio.AbstractEventLoop, code: int, header: bytes, body: bytes,
                          timeout: float, done: Callable[[_CallbackRequest], object]) -> bool:
        """From any thread but the loop's: write one small request straight to the socket, no hop
        through the loop thread. `done(request)` then runs on the loop thread, in the callback
        that read the answer (or saw the failure): `request.result()` is the response frame,
        `request.exception()` RequestTimeoutError (checked about once a second),
        ConnectionLostError, or None.

        False when nothing was written and `done` will not run: TLS, the kernel would not take
        the whole frame at once, or not connected; a dropped connection is then opened again on
        the loop thread (at most every RECONNECT_EVERY_S), for a later write. A connection used
        this way must not also be used with `request` or `send_oneway` (their writes come from the
        loop thread and could interleave)."""
        if self._tls is not None or self._closed:
            return False
        with self._thread_lock:
            proto = self._proto
            if proto is None or proto.lost or proto.transport is None:
                now = time.monotonic()
                if now - self._thread_reconnect >= RECONNECT_EVERY_S:
                    self._thread_reconnect = now
                    loop.call_soon_threadsafe(self._reconnect_in_background)
                return False
            sock = proto.thread_sock
            if sock is None:
                sock = proto.thread_sock = duplicate_socket(proto.transport)
                if sock is None:
                    return False
            request_id = next(self._ids)
            # one buffer: one send (FrameTooLargeError: nothing written)
            frame = wire.encode_parts(code, request_id, 0, header, body, self.settings.max_frame_size,
                                      len(body) + 1)[0]
            proto.pending[request_id] = _CallbackRequest(done)  # type: ignore[assignment]
            try:
                sent = sock.send(frame, socket.MSG_DONTWAIT)
            except OSError:
                sent = 0
            if sent != len(frame):
                del proto.pending[request_id]
                if sent:  # out of step: the server must never see the rest of another frame
                    loop.call_soon_threadsafe(proto.transport.abort)
                return False
            self._set_deadline(loop, request_id, timeout)
        return True

    def _reconnect_in_background(self) -> None:
        task = asyncio.ensure_future(self._ready())
        task.add_done_callback(_log_reconnect)

    def _expire_callback_requests(self) -> None:
        """On the loop thread, about once a second while callback requests (request_now,
        write_from_thread) are out: fail the ones past their deadline (a late answer is dropped,
        as for `request`)."""
        now = time.monotonic()
        proto = self._proto
        expired = []
        with self._thread_lock:
            deadlines = self._deadlines
            for rid in [rid for rid, at in deadlines.items() if at <= now or proto is None
                        or rid not in proto.pending]:
                del deadlines[rid]
                request = proto.pending.pop(rid, None) if proto is not None else None
                if request is not None and not request.done():
                    expired.append((rid, request))
            if deadlines and not self._closed:
                self._deadline_watch = asyncio.get_running_loop().call_later(1.0, self._expire_callback_requests)
            else:
                self._deadline_watch = None
        for rid, request in expired:  # outside the lock: done() runs the caller's code
            request.set_exception(RequestTimeoutError(f"no response to request {rid} within its timeout",
                                                      request_id=rid))

    async def send_oneway(self, frame: wire.Frame) -> None:
        """Send `frame` with FLAG_ONEWAY; no response is expected. Delivery is best effort: a drop
        after the write is not reported (a drop before it raises ConnectionLostError)."""
        frame.request_id = next(self._ids)
        frame.flags = (frame.flags | wire.FLAG_ONEWAY) & ~(wire.FLAG_RESPONSE | wire.FLAG_PUSH)
        buffers = wire.encode(frame, self.settings.max_frame_size)
        proto = self._proto
        if proto is None or proto.lost:
            proto = await self._ready()
        if proto.must_wait():
            await proto.write_turn()
        if proto.lost:
            raise proto.refusal or ConnectionLostError(f"connection to {self.address} lost")
        assert proto.writer is not None
        proto.writer.write(buffers)

    def _deliver_push(self, frame: wire.Frame) -> None:
        deliver_push(self.on_push, frame, self._push_tasks)

    def _drop(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            if proto.writer is not None:
                proto.writer.flush()  # a one-way frame sent just before close() still goes out
            proto.transport.close()
            proto.connection_lost(None)  # fail in-flight requests now, not on the next iteration

    async def close(self) -> None:
        """Close for good: in-flight requests fail with ConnectionLostError; later ones raise
        ClientClosedError. Push callbacks still running are cancelled."""
        if self._closed:
            return
        self._closed = True
        self._drop()
        for task in list(self._push_tasks):
            task.cancel()
        if self._push_tasks:
            await asyncio.gather(*self._push_tasks, return_exceptions=True)
        if self._connecting is not None:
            try:
                await asyncio.shield(self._connecting)
            except (TransportError, asyncio.CancelledError):
                pass
            self._drop()
        await asyncio.sleep(0)  # let the transport finish closing


class _CallbackRequest:
    """A request_now or write_from_thread request in `pending`: what the protocol does to a
    request's future (`done`, `set_result`, `set_exception`) runs the caller's `done` at once, in
    the protocol's own callback, instead of through a future's callback one loop turn later. That
    turn matters when a busy caller's thread holds the GIL: each turn waits for a GIL switch."""

    __slots__ = ("_done", "_result", "_exception", "_settled")

    def __init__(self, done: Callable[[_CallbackRequest], object]) -> None:
        self._done = done
        self._result: wire.Frame | None = None
        self._exception: BaseException | None = None
        self._settled = False

    def done(self) -> bool:
        return self._settled

    def cancelled(self) -> bool:
        return False

    def result(self) -> wire.Frame:
        if self._exception is not None:
            raise self._exception
        assert self._result is not None
        return self._result

    def exception(self) -> BaseException | None:
        return self._exception

    def set_result(self, frame: wire.Frame) -> None:
        self._result = frame
        self._settle()

    def set_exception(self, error: BaseException) -> None:
        self._exception = error
        self._settle()

    def _settle(self) -> None:
        self._settled = True
        try:
            self._done(self)
        except Exception:
            log.exception("a callback request's done() failed")


def _log_reconnect(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("reconnect for write_from_thread failed: %s", task.exception())


def _expire(fut: asyncio.Future, request_id: int, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(RequestTimeoutError(f"no response to request {request_id} within {timeout}s",
                                              request_id=request_id, timeout=timeout))
