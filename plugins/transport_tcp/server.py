"""The TCP server: one `asyncio.BufferedProtocol` per connection, frames cut by `FrameReader`.

Guarantees the broker relies on:
- Each request becomes its own task, created in arrival order, so the synchronous prefix of
  `handler.handle` runs in arrival order per connection (per-queue send order depends on it).
  Many requests are in flight per connection; responses go out as handlers finish.
- A handler that raises gets an error response (its EQueueError code, else "error"), never a hang.
- Bad input only ever affects the connection it came on: an oversized or undecodable frame whose
  head parsed gets an error frame; an unparseable stream is closed; a connection that stops in the
  middle of a frame for `frame_read_timeout` seconds is closed.
- `handler.connection_lost(conn)` is called exactly once per connection, and the connection leaves
  `TcpServer.connections` at that moment.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping

from equeue_plugins.transport_tcp.framing import FrameReader, Head, WriteCoalescer, error_for_head

from equeue_core import frame as wire
from equeue_core.contracts import ServerHandler, TransportSettings
from equeue_core.errors import EQueueError, FrameTooLargeError, ProtocolError

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 4096  # requests being handled per connection before we stop reading from it
CLOSE_SETTLE = 0.05  # seconds server.close() lets nearly finished handlers finish
CLOSE_FLUSH = 1.0  # seconds server.close() lets written responses drain before aborting


async def resolve(host: str, port: int, passive: bool = False) -> tuple[int, tuple]:
    """(family, sockaddr) for host:port. An IP literal is used as is (no resolver thread, no
    delay); a name goes through the loop's getaddrinfo and the first answer is taken."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, ((host, port) if family == socket.AF_INET else (host, port, 0, 0))
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE if passive else 0)
    return infos[0][0], infos[0][4]


def tune_socket(sock: socket.socket, buffer_size: int) -> None:
    """TCP_NODELAY (frames are whole writes; Nagle only adds latency) and large kernel buffers."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
    if buffer_size > 0:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, buffer_size)
            except OSError:
                pass


class TcpServerConnection(asyncio.BufferedProtocol):
    """One accepted connection; also the `ServerConnection` handed to the handler."""

    def __init__(self, server: TcpServer, conn_id: int) -> None:
        self.id = conn_id
        self.peer = "?"
        self._server = server
        self._handler = server.handler
        self._max_frame = server.settings.max_frame_size
        self._read_timeout = server.settings.frame_read_timeout
        self._transport: asyncio.Transport | None = None
        self._writer: WriteCoalescer | None = None
        self._closed = False
        self._tasks: set[asyncio.Task] = set()
        self._write_paused = False
        self._reading_paused = False
        self._resumed: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.reader = FrameReader(self._max_frame, self._on_frame, self._on_oversized,
                                  self._on_bad_frame, self._on_fatal)

    # ------------------------------------------------------------ ServerConnection

    @property
    def closed(self) -> bool:
        return self._closed

    def push(self, frame: wire.Frame) -> None:
        """Send an unsolicited frame (FLAG_PUSH is set here). Dropped if the connection is gone;
        FrameTooLargeError if it is over the maximum frame size (nothing is sent)."""
        frame.flags |= wire.FLAG_PUSH
        buffers = wire.encode(frame, self._max_frame)
        if not self._closed and self._writer is not None:
            self._writer.write(buffers)

    def close(self) -> None:
        """Close the connection: frames already written are flushed first, in-flight handler
        tasks are cancelled (connection_lost follows once the kernel buffer drains)."""
        if self._writer is not None:
            self._writer.flush()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    # ------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._writer = WriteCoalescer(transport, self._loop)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock, self._server.settings.socket_buffer)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self._server._connections[self.id] = self

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.feed(nbytes)
        if self.reader.partial:
            self._last_data = self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_at(self._last_data + self._read_timeout, self._check_stalled)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._tasks:
            task.cancel()
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self._server._connections.pop(self.id, None)
        try:
            self._handler.connection_lost(self)
        except Exception:  # a handler bug must not break the transport
            log.exception("handler.connection_lost failed for connection %s", self.id)

    def pause_writing(self) -> None:
        # The peer is not reading its responses: stop reading its requests until it catches up.
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self._resumed = None

    def _update_reading(self) -> None:
        """Read only while the peer reads our answers and has fewer than MAX_IN_FLIGHT requests
        being handled: a flooding client waits in its own socket buffer, not in our memory."""
        if self._transport is None or self._closed:
            return
        stop = self._write_paused or len(self._tasks) >= MAX_IN_FLIGHT
        if stop and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        elif not stop and self._reading_paused and len(self._tasks) <= MAX_IN_FLIGHT // 2:
            self._reading_paused = False
            self._transport.resume_reading()

    # ------------------------------------------------------------ frames

    def _on_frame(self, frame: wire.Frame) -> None:
        if self._closed:
            return
        task = self._loop.create_task(self._serve(frame))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self._update_reading()

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self._reading_paused:
            self._update_reading()

    async def _serve(self, request: wire.Frame) -> None:
        try:
            response = await self._handler.handle(self, request)
        except asyncio.CancelledError:
            raise
        except EQueueError as e:
            response = request.error_response(e.code, str(e), **_plain(e.details))
        except Exception as e:
            log.exception("handler failed on request code %s", request.code)
            response = request.error_response("error", f"{type(e).__name__}: {e}")
        if response is None or request.is_oneway or self._closed:
            return
        response.request_id = request.request_id
        response.flags |= wire.FLAG_RESPONSE
        try:
            buffers = wire.encode(response, self._max_frame)
        except FrameTooLargeError as e:
            buffers = wire.encode(request.error_response(e.code, str(e), **_plain(e.details)))
        if self._write_paused:
            if self._resumed is None:
                self._resumed = self._loop.create_future()
            await self._resumed
            if self._closed:
                return
        assert self._writer is not None
        self._writer.write(buffers)

    def _on_oversized(self, head: Head, err: FrameTooLargeError) -> None:
        if not head[4] & wire.FLAG_ONEWAY:
            self._write_error(head, err)

    def _on_bad_frame(self, head: Head, err: ProtocolError) -> None:
        if not head[4] & wire.FLAG_ONEWAY:
            self._write_error(head, err)

    def _write_error(self, head: Head, err: ProtocolError) -> None:
        if self._writer is not None and not self._closed:
            self._writer.write(wire.encode(error_for_head(head, err)))

    def _on_fatal(self, err: ProtocolError) -> None:
        log.info("closing connection %s from %s: %s", self.id, self.peer, err)
        self.close()

    def _check_stalled(self) -> None:
        self._timer = None
        if self._closed or not self.reader.partial:
            return
        due = self._last_data + self._read_timeout
        if self._loop.time() >= due:
            log.info("closing connection %s from %s: no bytes for %.1fs in the middle of a frame",
                     self.id, self.peer, self._read_timeout)
            assert self._transport is not None
            self._transport.abort()
        else:
            self._timer = self._loop.call_at(due, self._check_stalled)


def _plain(details: Mapping[str, object]) -> dict[str, object]:
    """Error details as msgpack-safe values (anything else becomes its str)."""
    out: dict[str, object] = {}
    for k, v in details.items():
        out[str(k)] = v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
    return out


class TcpServer:
    """A listening TCP socket serving frames to one handler. `address` is the bound (host, port)."""

    def __init__(self, handler: ServerHandler, settings: TransportSettings) -> None:
        self.handler = handler
        self.settings = settings
        self.address: tuple[str, int] = ("", 0)
        self._connections: dict[int, TcpServerConnection] = {}
        self._next_id = 0
        self._server: asyncio.base_events.Server | None = None

    @property
    def connections(self) -> Mapping[int, TcpServerConnection]:
        """Open connections by id (read-only view; tests use it to check nothing leaks)."""
        return self._connections

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        family, sockaddr = await resolve(host, port, passive=True)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Accepted sockets inherit the buffer sizes set before listen().
            tune_socket(sock, self.settings.socket_buffer)
            sock.bind(sockaddr)
            sock.setblocking(False)
            self._server = await loop.create_server(self._new_connection, sock=sock, backlog=1024)
        except BaseException:
            sock.close()
            raise
        bound = sock.getsockname()
        self.address = (bound[0], bound[1])

    def _new_connection(self) -> TcpServerConnection:
        self._next_id += 1
        return TcpServerConnection(self, self._next_id)

    async def close(self) -> None:
        """Stop accepting and close every connection; handlers see connection_lost and the
        connections leave `connections` before this returns.

        Gentle first: handlers that are about to finish (a held pull just woken) get up to
        CLOSE_SETTLE seconds, responses already written are flushed (up to CLOSE_FLUSH seconds
        for a peer that does not read); then whatever remains is aborted and its tasks cancelled.
        """
        if self._server is not None:
            self._server.close()
        conns = list(self._connections.values())
        tasks = [t for c in conns for t in c._tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_SETTLE)
        for conn in conns:
            conn.close()
        deadline = asyncio.get_running_loop().time() + CLOSE_FLUSH
        while self._connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        for conn in list(self._connections.values()):
            if conn._transport is not None:
                conn._transport.abort()
        tasks = [t for c in conns for t in c._tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        # abort() reports connection_lost on the next loop iteration; give it that iteration.
        for _ in range(10):
            if not self._connections:
                break
            await asyncio.sleep(0)
