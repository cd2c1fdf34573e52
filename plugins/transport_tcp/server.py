"""The TCP server: one `asyncio.BufferedProtocol` per connection, frames cut by `FrameReader`.

Guarantees the broker relies on:
- Each request becomes its own task, created in arrival order, so the synchronous prefix of
  `handler.handle` runs in arrival order per connection (per-queue send order depends on it).
  Many requests are in flight per connection; responses go out as handlers finish.
- Fast path (contracts.ImmediateServerHandler): a request whose code is in the handler's
  `now_codes` goes to `handler.handle_now` at arrival instead, when no earlier request of the
  connection still waits for its task to start, so arrival order of the synchronous parts holds
  across both paths. If it answers at once, the answer is written in the same callback (the
  answers to the frames of one read leave in one write at its end) and no task is made; if it
  returns an awaitable, a task awaits it. Admission and the bounds below count it the same way.
  An awaitable with `listen` (a late answer: a held pull, equeue_core.broker.long_poll) gets no
  task: its answer is written in the very callback that gives it (the append that woke the
  pull) and handed to the kernel in the same loop turn as that read's own answers: before them
  when the read woke pulls on at most LATE_FIRST_MAX connections, after them otherwise. A read that is exactly one small frame (a
  peer waiting for each answer) skips the admission's hand-offs when it would start at once
  (`_on_lone`), counted the same way.
- A handler that raises gets an error response (its EQueueError code, else "error"), never a hang.
- Bad input only ever affects the connection it came on: an oversized or undecodable frame whose
  head parsed gets an error frame; an unparseable stream is closed; a connection that stops in the
  middle of a frame for `frame_read_timeout` seconds is closed.
- `handler.connection_lost(conn)` is called exactly once per connection, and the connection leaves
  `TcpServer.connections` at that moment.
- Memory per connection is bounded (equeue_core.admission): requests start only while the
  connection's unsent responses plus its unanswered requests stay within
  `max_connection_bytes`, at most `max_requests_in_flight` at once; meanwhile the connection is
  not read, so a client that floods or stops reading waits in its own socket buffer.
- At most `max_connections` connections: one more gets a `too_many_connections` error frame
  (request id 0) and is closed, never seen by the handler. A connection that sends nothing and
  has no request being handled (a held pull is one) for `idle_timeout` seconds is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Mapping

from equeue_plugins.transport_tcp.framing import FrameReader, Head, WriteCoalescer, error_for_head

from equeue_core import frame as wire
from equeue_core.admission import REQUEST_COST, RequestAdmission
from equeue_core.contracts import ServerHandler, TransportSettings
from equeue_core.errors import FrameTooLargeError, ProtocolError, TooManyConnectionsError
from equeue_core.server_answers import answer, answer_now, plain_details

# A read whose requests woke held pulls on at most this many other connections writes their
# answers before its own (e2e p50 -12 us, p99 -20 us at 5k msg/s, docs/benchmarks.md); one that
# woke more writes its own first, so a sender's acknowledgement waits for at most this many writes.
LATE_FIRST_MAX = 2
log = logging.getLogger(__name__)

MAX_IN_FLIGHT = TransportSettings().max_requests_in_flight  # the default (tests use it)
IDLE_CHECKS = 4  # the idle sweep runs this many times per idle_timeout (at most every 5 s)
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
        self._refused = False
        self._tasks: set[asyncio.Task] = set()
        self._late: set = set()  # late answers (held pulls) not given yet
        self._unstarted = 0  # handle() tasks created and not yet started (fast path waits behind them)
        self._now_codes: frozenset[int] = server.now_codes
        self._reading_paused = False
        self._loop = asyncio.get_running_loop()
        self._last_data = 0.0
        self.last_activity = self._loop.time()  # when bytes last arrived (the idle check reads it)
        self._timer: asyncio.TimerHandle | None = None
        self._admission: RequestAdmission[wire.Frame] = RequestAdmission(
            server.settings.max_connection_bytes, server.settings.max_requests_in_flight,
            self._start, self._unsent, self._update_reading)
        self.reader = FrameReader(self._max_frame, self._on_frame, self._on_oversized,
                                  self._on_bad_frame, self._on_fatal)

    # ------------------------------------------------------------ ServerConnection

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> bool:
        """Nothing being handled or waiting for this connection (a held pull is being handled)."""
        return not self._tasks and not self._late and not self._admission.blocked

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
        self._writer = WriteCoalescer(transport, self._loop, self._flushed)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune_socket(sock, self._server.settings.socket_buffer)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        limit = self._server.settings.max_connections
        if len(self._server._connections) >= limit:
            self._refuse(limit)
            return
        # pause_writing above half the budget; resume_writing (below a quarter) retries the
        # requests that wait (equeue_core.admission)
        budget = self._server.settings.max_connection_bytes
        transport.set_write_buffer_limits(high=max(1, budget // 2), low=budget // 4)  # type: ignore[attr-defined]
        self._server._connections[self.id] = self

    def _refuse(self, limit: int) -> None:
        """Over the connection limit: one error frame (request id 0), then close."""
        self._refused = self._closed = True
        err = TooManyConnectionsError(f"the broker has reached its limit of {limit} connections",
                                      limit=limit)
        log.warning("refusing the connection from %s: %s", self.peer, err)
        refusal = wire.Frame(0, 0, 0).error_response(err.code, str(err), **plain_details(err.details))
        assert self._transport is not None and self._writer is not None
        self._writer.write(wire.encode(refusal))
        self._writer.flush()
        self._transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.last_activity = self._loop.time()
        if self._refused:
            return
        writer = self._writer
        assert writer is not None
        writer.hold()  # answers given while parsing this read leave together at its end
        server = self._server
        server.parsing += 1
        try:
            # A peer that waits for each answer sends one whole frame per read: take it without
            # the general parser's bookkeeping (same frame, same admission, same order).
            lone = self.reader.feed_lone(nbytes)
            if lone is None:
                self.reader.feed(nbytes)
            else:
                self._on_lone(lone)
        finally:
            server.parsing -= 1
            if server.late and not server.parsing:
                # held pulls this read woke: a few leave before its own answers, many after them
                if len(server.late) <= LATE_FIRST_MAX:
                    server.write_late()
                    writer.release()
                else:
                    writer.release()
                    server.write_late()
            else:
                writer.release()
        if self.reader.partial:
            self._last_data = self.last_activity
            if self._timer is None:
                self._timer = self._loop.call_at(self._last_data + self._read_timeout, self._check_stalled)
        if self._admission.blocked and not self._reading_paused and not self._closed:
            self._reading_paused = True  # requests wait: leave the rest in the peer's socket
            assert self._transport is not None
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed:
            return  # (a refused connection is closed from the start: the handler never saw it)
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._admission.clear()
        for task in self._tasks:
            task.cancel()
        for late in list(self._late):
            late.cancel()  # the handler drops it
        self._late.clear()
        self._server._connections.pop(self.id, None)
        try:
            self._handler.connection_lost(self)
        except Exception:  # a handler bug must not break the transport
            log.exception("handler.connection_lost failed for connection %s", self.id)

    def pause_writing(self) -> None:
        pass  # the admission reads the write buffer's size itself

    def _flushed(self) -> None:
        # Responses went to the kernel: requests that wait for the budget may start now (a fast
        # path answer leaves no handler running whose end would retry them).
        if self._admission.blocked and not self._closed and not self._transport.is_closing():  # type: ignore[union-attr]
            self._admission.retry()

    def resume_writing(self) -> None:
        # The peer caught up with its responses: start what waits (then read again).
        if not self._closed:
            self._admission.retry()

    def _update_reading(self) -> None:
        if self._reading_paused and not self._admission.blocked and not self._closed:
            self._reading_paused = False
            assert self._transport is not None
            self._transport.resume_reading()

    # ------------------------------------------------------------ frames

    def _unsent(self) -> int:
        return self._writer.unsent() if self._writer is not None else 0

    def _on_frame(self, frame: wire.Frame) -> None:
        if self._closed:
            return
        self._admission.offer(frame, wire.HEAD_SIZE + len(frame.body))

    def _on_lone(self, request: wire.Frame) -> None:
        """The one frame of a read (a peer that waits for each answer: a one-by-one `send`).
        When the admission would start it at once and the handler answers it at once (fast
        path), it is run here without the general path's hand-offs: same handler call, same
        admission counts (RequestAdmission.starts_alone), same answer bytes, written straight to
        the transport when nothing else of this connection waits to be written (else through the
        writer, in order). Anything else takes `_on_frame`."""
        adm = self._admission
        if (self._closed or self._unstarted or request.code not in self._now_codes
                or not adm.starts_alone()):
            self._on_frame(request)
            return
        size = wire.HEAD_SIZE + len(request.body) + REQUEST_COST
        adm.charged += size
        adm.running += 1
        response = answer_now(self._handler, self, request)
        if response is not None and type(response) is not wire.Frame:  # the answer waits
            adm.reserve()
            self._answer_later(request, response)
            return
        adm.running -= 1
        adm.charged -= size
        writer = self._writer
        if response is None or request.flags & wire.FLAG_ONEWAY or self._closed:
            return
        if (writer is None or writer.pending_bytes or self._server.late or self._transport is None
                or self._transport.is_closing()):
            self._respond(request, response)  # (ordered with the held pulls it woke: buffer_updated)
            return
        buffers = self._encoded(request, response)
        if len(buffers) == 1:
            self._transport.write(buffers[0])
            adm.responded(len(buffers[0]))
        else:
            self._transport.writelines(buffers)
            adm.responded(len(buffers[0]) + len(buffers[1]))

    def _start(self, frame: wire.Frame) -> bool:
        """Run a request the admission let in; True if it is answered already (fast path)."""
        if frame.code in self._now_codes and not self._unstarted:
            return self._answer_now(frame)
        self._unstarted += 1
        task = self._loop.create_task(self._serve(frame))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return False

    def _answer_now(self, request: wire.Frame) -> bool:
        response = answer_now(self._handler, self, request)
        if response is not None and type(response) is not wire.Frame:
            self._answer_later(request, response)
            return False
        self._respond(request, response)
        return True

    def _answer_later(self, request: wire.Frame, response: Awaitable[wire.Frame | None]) -> None:
        """What handle_now left to wait for: a late answer, or a task that awaits the rest."""
        listen = getattr(response, "listen", None)
        if listen is not None:  # a late answer (a held pull): written in the turn it is given
            self._late.add(response)
            listen(lambda frame: self._late_answer(request, response, frame))
            return
        task = self._loop.create_task(self._serve_rest(request, response))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _late_answer(self, request: wire.Frame, late: object, response: wire.Frame | None) -> None:
        """A late answer given (contracts.ImmediateServerHandler), usually inside another
        request's handling (the append that woke a held pull): written into this connection's
        writer now, and handed to the kernel once the read being parsed is parsed: before that
        read's own answers when it woke at most LATE_FIRST_MAX connections' pulls (a consumer's
        wake-up is the latency a user measures; the waking send's acknowledgement follows a
        syscall later), after them when it woke more (a producer's latency must not grow with
        the number of waiting consumers); with them when the read is this connection's own; at
        once outside any read. Requests waiting for this
        connection's budget start on the next turn, not nested in there."""
        self._late.discard(late)
        self._respond(request, response)
        writer = self._writer
        if writer is not None and not writer.held:
            if self._server.parsing:
                self._server.late.append(writer)
            else:
                writer.flush()
        size = wire.HEAD_SIZE + len(request.body)
        if self._admission.backlog:  # starting waiting requests: not inside another request's append
            self._loop.call_soon(self._admission.finished, size)
        else:
            self._admission.finished(size)
        self.last_activity = self._loop.time()

    async def _serve(self, request: wire.Frame) -> None:
        self._unstarted -= 1
        try:
            await self._answer(request, None)
        finally:
            self._admission.finished(wire.HEAD_SIZE + len(request.body))
            self.last_activity = self._loop.time()  # idle time counts from the last answer too

    async def _serve_rest(self, request: wire.Frame, rest: Awaitable[wire.Frame | None]) -> None:
        try:
            await self._answer(request, rest)
        finally:
            self._admission.finished(wire.HEAD_SIZE + len(request.body))
            self.last_activity = self._loop.time()

    async def _answer(self, request: wire.Frame, rest: Awaitable[wire.Frame | None] | None) -> None:
        self._respond(request, await answer(self._handler, self, request, rest))

    def _respond(self, request: wire.Frame, response: wire.Frame | None) -> None:
        if response is None or request.is_oneway or self._closed:
            return
        buffers = self._encoded(request, response)
        assert self._writer is not None
        self._admission.responded(self._writer.write(buffers))
        if self._admission.blocked:  # look again once this iteration's writes have left
            self._loop.call_soon(self._admission.retry)

    def _encoded(self, request: wire.Frame, response: wire.Frame) -> list:
        """The answer to `request` as buffers to write (an error frame if it is over the
        maximum frame size)."""
        response.request_id = request.request_id
        response.flags |= wire.FLAG_RESPONSE
        try:
            return wire.encode(response, self._max_frame)
        except FrameTooLargeError as e:
            return wire.encode(request.error_response(e.code, str(e), **plain_details(e.details)))

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




class TcpServer:
    """A listening TCP socket serving frames to one handler. `address` is the bound (host, port)."""

    def __init__(self, handler: ServerHandler, settings: TransportSettings) -> None:
        self.handler = handler
        self.settings = settings
        self.address: tuple[str, int] = ("", 0)
        self._connections: dict[int, TcpServerConnection] = {}
        self._next_id = 0
        # the fast path (contracts.ImmediateServerHandler) when the handler offers it
        self.now_codes: frozenset[int] = (frozenset(getattr(handler, "now_codes", ()))
                                          if callable(getattr(handler, "handle_now", None)) else frozenset())
        self._server: asyncio.base_events.Server | None = None
        self._idle_task: asyncio.Task | None = None
        self._tls_accept: asyncio.Task | None = None  # with tls_cert: our own accept loop (tls.py)
        self._listener: socket.socket | None = None
        self.parsing = 0  # > 0 while a connection's read callback parses its frames
        self.late: list = []  # writers holding late answers given meanwhile (TcpServerConnection._late_answer)

    def write_late(self) -> None:
        """Hand the late answers given while a read was parsed to the kernel."""
        late, self.late = self.late, []
        for writer in late:
            writer.flush()

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
            if self.settings.tls_cert:
                from equeue_plugins.transport_tcp import tls

                ctx = tls.server_context(self.settings)
                sock.listen(1024)
                self._listener = sock
                self._tls_accept = loop.create_task(tls.accept_forever(self, sock, ctx))
            else:
                self._server = await loop.create_server(self._new_connection, sock=sock, backlog=1024)
        except BaseException:
            sock.close()
            raise
        bound = sock.getsockname()
        self.address = (bound[0], bound[1])
        if self.settings.idle_timeout > 0:
            self._idle_task = loop.create_task(self._close_idle_forever(self.settings.idle_timeout))

    async def _close_idle_forever(self, timeout: float) -> None:
        """Close connections idle for `timeout` seconds (nothing received, nothing being handled)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(timeout / IDLE_CHECKS, 5.0))
            now = loop.time()
            for conn in list(self._connections.values()):
                if conn.idle and now - conn.last_activity >= timeout:
                    log.info("closing connection %s from %s: idle for %.1fs", conn.id, conn.peer,
                             now - conn.last_activity)
                    conn.close()

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
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None
        if self._server is not None:
            self._server.close()
        if self._tls_accept is not None:
            self._tls_accept.cancel()
            await asyncio.gather(self._tls_accept, return_exceptions=True)
            self._tls_accept = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
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
