"""The ZeroMQ server: one ROUTER socket; each DEALER peer (by routing identity) is a connection.

Guarantees (the same as the TCP server's, see docs/protocol.md):
- Requests become tasks in arrival order per peer; responses go back to the peer's identity.
  With a handler that has the fast path (contracts.ImmediateServerHandler), a request whose code
  is in its `now_codes` goes to `handle_now` at arrival instead (when no earlier request of the
  peer still waits for its task to start), answered without a task unless it hands back an
  awaitable; its answer leaves in the same batch as the others of this loop iteration.
- A frame over `max_frame_size` gets an error frame. A single message part over it is refused by
  ZeroMQ itself (ZMQ_MAXMSGSIZE), which drops that peer's connection: memory stays bounded.
- A frame that does not decode gets an error frame if its head parsed, else it is dropped (a ROUTER
  cannot close one peer; the message is simply ignored).
- A peer is *known* from its first message. It is *gone* when ZeroMQ reports its TCP connection
  disconnected (socket monitor, matched to the peer by the connection's file descriptor), which
  includes a peer silent past the ZMTP heartbeat timeout; `handler.connection_lost` is called once
  and the peer leaves `connections`.
- Replies to each peer leave in order from that peer's own queue: a peer whose ZeroMQ queue is
  full (it does not read) never holds up replies to anyone else.
- Memory per peer is bounded (equeue_core.admission): its requests start only while its unsent
  replies plus its unanswered requests stay within `max_connection_bytes` (at most
  `max_requests_in_flight` at once); the rest wait in order. A ROUTER cannot stop reading one peer,
  so while a peer's unanswered requests are over twice the budget, what it sends is dropped unread
  (its client sees those requests time out). ZeroMQ's own reply queue per peer holds at most
  `SNDHWM` messages (the budget / 512 KiB, at least 2).
- At most `max_connections` known peers: the requests of one more are answered with a
  `too_many_connections` error and its connection is then closed. A known peer that sends nothing
  and has no request being handled (a held pull is one) for `idle_timeout` seconds is disconnected.
  Closing one peer's connection, which ZeroMQ has no call for, is a `shutdown()` of the TCP socket
  it accepted (its descriptor, from `ZMQ_SRCFD`, checked against the monitor's view); ZeroMQ then
  tears the connection down itself and the client reconnects. Only peers whose input ZeroMQ has
  not stopped are cut this way (idle or refused ones), never a flooding one (see the HWM note).
- `close()` ends every task, closes every socket with LINGER 0 and terminates its own context.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Mapping

import zmq
from equeue_plugins.transport_zmq import curve
from equeue_plugins.transport_zmq.parts import (
    FLUSH_BYTES,
    FrameBatcher,
    error_for_head,
    parse_message,
    set_common_options,
)
from equeue_plugins.transport_zmq.pump import SocketPump
from zmq.utils.monitor import parse_monitor_message

from equeue_core import frame as wire
from equeue_core.admission import RequestAdmission
from equeue_core.contracts import ServerHandler, TransportSettings
from equeue_core.errors import FrameTooLargeError, ProtocolError, TooManyConnectionsError
from equeue_core.server_answers import answer, answer_now, plain_details

log = logging.getLogger(__name__)

CLOSE_SETTLE = 0.05  # seconds close() lets nearly finished handlers finish
REFUSE_LINGER = 0.5  # seconds a refused peer's error replies get to leave before it is cut off
IDLE_CHECKS = 4  # the idle sweep runs this many times per idle_timeout (at most every 5 s)


class ZmqServerConnection:
    """One DEALER peer of the ROUTER, known by its routing identity."""

    def __init__(self, server: ZmqServer, conn_id: int, identity: bytes, fd: int, peer: str) -> None:
        self.id = conn_id
        self.peer = peer
        self.identity = identity
        self.fd = fd
        self._server = server
        self._closed = False
        self.tasks: set[asyncio.Task] = set()
        self.unstarted = 0  # handle() tasks created and not yet started (the fast path waits behind them)
        self.retry_soon = False  # a retry of the admission's backlog is scheduled
        self.outbox: deque[tuple[list, bool, int]] = deque()  # replies ZeroMQ did not take yet
        self.queued = 0  # their bytes
        self.last_activity = server._loop.time()
        self.dropping = False  # over twice its budget: its messages are dropped unread
        st = server.settings
        self.admission: RequestAdmission[wire.Frame] = RequestAdmission(
            st.max_connection_bytes, st.max_requests_in_flight, self._start, self.unsent, _nothing)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> bool:
        return not self.tasks and not self.admission.blocked

    def unsent(self) -> int:
        """Reply bytes for this peer that ZeroMQ has not taken yet."""
        batcher = self._server._batcher
        return self.queued + (batcher.pending_bytes(self.identity) if batcher is not None else 0)

    def push(self, frame: wire.Frame) -> None:
        """Send an unsolicited frame (FLAG_PUSH is set here). Best effort: dropped if the peer is
        gone; FrameTooLargeError (nothing sent) if over the maximum frame size."""
        frame.flags |= wire.FLAG_PUSH
        buffers = wire.encode(frame, self._server.settings.max_frame_size)
        if not self._closed:
            self._server._write(self.identity, buffers)

    def _start(self, request: wire.Frame) -> bool:
        """Run a request the admission let in; True if it is answered already (fast path)."""
        server = self._server
        if request.code in server.now_codes and not self.unstarted:
            return server._answer_now(self, request)
        self.unstarted += 1
        self._track(server._loop.create_task(server._serve(self, request)))  # in arrival order
        return False

    def _track(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def retry_later(self) -> None:
        """Requests wait and no handler of ours runs to retry them: look again after this
        iteration's replies have gone to ZeroMQ (the batcher's flush is scheduled before this)."""
        if not self.retry_soon:
            self.retry_soon = True
            self._server._loop.call_soon(self._retry)

    def _retry(self) -> None:
        self.retry_soon = False
        if not self._closed:
            self.admission.retry()


class ZmqServer:
    """A ROUTER socket serving frames to one handler. `address` is the bound (host, port)."""

    def __init__(self, handler: ServerHandler, settings: TransportSettings,
                 heartbeat_ivl: float, heartbeat_timeout: float) -> None:
        self.handler = handler
        self.settings = settings
        self.address: tuple[str, int] = ("", 0)
        # the fast path (contracts.ImmediateServerHandler) when the handler offers it
        self.now_codes: frozenset[int] = (frozenset(getattr(handler, "now_codes", ()))
                                          if callable(getattr(handler, "handle_now", None)) else frozenset())
        self._hb = (heartbeat_ivl, heartbeat_timeout)
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._pump: SocketPump | None = None
        self._monitor_pump: SocketPump | None = None
        self._batcher: FrameBatcher | None = None
        self._by_identity: dict[bytes, ZmqServerConnection] = {}
        self._by_fd: dict[int, ZmqServerConnection] = {}
        self._connections: dict[int, ZmqServerConnection] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._blocked: set[ZmqServerConnection] = set()  # peers with replies ZeroMQ did not take
        self._refusing: set[bytes] = set()
        self._idle_task: asyncio.Task | None = None
        self.zap: curve.ZapHandler | None = None  # with curve_allowed_keys: lets in listed client keys
        self.handshake_failures = curve.RateLimitedLog()  # CURVE handshakes that failed (logged, counted)

    @property
    def connections(self) -> Mapping[int, ZmqServerConnection]:
        """Known peers by connection id (read-only view; tests use it to check nothing leaks)."""
        return self._connections

    async def start(self, host: str, port: int) -> None:
        self._ctx = zmq.Context()
        self._loop = asyncio.get_running_loop()
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            set_common_options(sock, self.settings.socket_buffer, *self._hb)
            curve.configure_server(sock, self.settings)  # with curve_secret_key: CURVE only
            if self.settings.curve_secret_key and self.settings.curve_allowed_keys:
                self.zap = curve.ZapHandler(self._ctx, self.settings.curve_allowed_keys)
            # Hard bound on any one message part; the per-frame check below gives the clear error.
            # (Under CURVE ZeroMQ checks the encrypted part, a few dozen bytes longer: a margin
            # keeps "just over the limit" a clear error frame rather than a dropped connection.)
            sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_frame_size
                            + (curve.MESSAGE_OVERHEAD if self.settings.curve_secret_key else 0))
            # A peer that connects but does not finish the ZMTP handshake in time is dropped (the
            # nearest ZeroMQ has to the TCP transport's slow-loris timeout).
            sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(self.settings.frame_read_timeout * 1000)))
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # full or unknown peer: an error, not a silent drop
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting peer takes over its identity
            # ZeroMQ's own reply queue per peer, in messages (mostly up to FLUSH_BYTES each):
            # about half a budget. Replies that do not fit wait in the peer's outbox, where the
            # budget counts them. (The inbound queue keeps its large HWM on purpose: libzmq 4.3
            # aborts the process (assert !_io_error) when a peer whose input was stopped at the
            # HWM hangs up and is then sent a reply.)
            sock.setsockopt(zmq.SNDHWM, max(2, self.settings.max_connection_bytes // (2 * FLUSH_BYTES)))
            self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
                                                    | (curve.HANDSHAKE_FAILED if self.settings.curve_secret_key else 0))
            sock.bind(f"tcp://{host}:{port if port else '*'}")
        except BaseException:
            self._close_sockets(sock)
            raise
        self._sock = sock
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        bound_host, _, bound_port = endpoint.rpartition("//")[2].rpartition(":")
        self.address = (bound_host.strip("[]"), int(bound_port))
        assert self._monitor is not None
        self._monitor_pump = SocketPump(self._monitor, self._on_monitor_event)
        # Monitor events first: ZeroMQ queues a connection's ACCEPTED (and the DISCONNECTED of the
        # connection that held its fd before) ahead of any message from it, so reading them
        # before each batch of messages keeps the fd -> peer map exact.
        self._pump = SocketPump(sock, self._on_message_safe, before_batch=self._monitor_pump.poll,
                                on_writable=self._send_queued)
        self._batcher = FrameBatcher(self._send_message)
        if self.settings.idle_timeout > 0:
            self._idle_task = self._loop.create_task(self._close_idle_forever(self.settings.idle_timeout))

    # ------------------------------------------------------------ receiving

    def _on_message_safe(self, msg: list[zmq.Frame]) -> None:
        """One bad message must never end the receive loop (and with it every peer's service)."""
        try:
            self._on_message(msg)
        except Exception:
            log.exception("dropping a message that could not be handled")

    def _on_message(self, msg: list[zmq.Frame]) -> None:
        if len(msg) < 2:
            return
        ident_part = msg[0]
        identity = ident_part.bytes
        conn = self._by_identity.get(identity)
        try:
            fd = ident_part.get(zmq.SRCFD)
        except zmq.ZMQError:
            fd = -1
        if conn is None or conn.fd != fd:
            if (len(self._connections) >= self.settings.max_connections
                    and (conn is None or conn._closed)):
                self._refuse(identity, fd, msg[1:])
                return
            conn = self._register(identity, fd, ident_part)
        conn.last_activity = self._loop.time()
        admission = conn.admission
        if admission.charged > 2 * admission.budget:
            # It sends while not reading its replies: what it sends now is dropped unread (a
            # ROUTER cannot stop reading one peer; its client sees these requests time out).
            if not conn.dropping:
                conn.dropping = True
                log.warning("peer %s (%s) does not read its replies and has over %d bytes of requests "
                            "waiting: dropping what it sends until it catches up", conn.id, conn.peer,
                            2 * admission.budget)
            return
        conn.dropping = False

        limit = 2 * admission.budget

        def on_frame(request: wire.Frame) -> None:
            if admission.charged <= limit:
                admission.offer(request, wire.HEAD_SIZE + len(request.body))
                if admission.blocked and not admission.running:
                    conn.retry_later()

        def on_error(head: tuple | None, err: ProtocolError) -> None:
            if head is not None and not head[4] & wire.FLAG_ONEWAY:
                self._write(identity, wire.encode(error_for_head(head, err)))  # type: ignore[arg-type]
            elif head is None:
                log.info("dropping the rest of a message from %s: %s", conn.peer, err)

        parse_message(msg[1:], self.settings.max_frame_size, on_frame, on_error)

    def _refuse(self, identity: bytes, fd: int, parts: list) -> None:
        """Over max_connections: answer this peer's requests with the error, then cut it off."""
        limit = self.settings.max_connections
        err = TooManyConnectionsError(f"the broker has reached its limit of {limit} connections",
                                      limit=limit)

        def on_frame(request: wire.Frame) -> None:
            if not request.is_oneway:
                response = request.error_response(err.code, str(err), limit=limit)
                response.request_id = request.request_id
                response.flags |= wire.FLAG_RESPONSE
                self._write(identity, wire.encode(response))

        parse_message(parts, self.settings.max_frame_size, on_frame, lambda head, e: None)
        if identity not in self._refusing:
            self._refusing.add(identity)
            log.warning("refusing a connection (fd %s): %s", fd, err)
            self._loop.call_later(REFUSE_LINGER, self._cut_refused, identity, fd)

    def _cut_refused(self, identity: bytes, fd: int) -> None:
        self._refusing.discard(identity)
        if fd >= 0 and fd not in self._by_fd and not self._closed:
            self._shutdown_fd(fd)

    def _kick(self, conn: ZmqServerConnection, reason: str) -> None:
        """Disconnect one peer (see the module docstring) and report it lost."""
        log.info("disconnecting peer %s (%s): %s", conn.id, conn.peer, reason)
        if conn.fd >= 0 and self._by_fd.get(conn.fd) is conn:
            self._shutdown_fd(conn.fd)
        self._lost(conn)

    def _shutdown_fd(self, fd: int) -> None:
        """shutdown() the TCP connection ZeroMQ accepted on `fd` (only if it is one of ours)."""
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return
        try:
            if sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == self.address[1]:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()

    async def _close_idle_forever(self, timeout: float) -> None:
        while True:
            await asyncio.sleep(min(timeout / IDLE_CHECKS, 5.0))
            now = self._loop.time()
            for conn in list(self._connections.values()):
                if conn.idle and now - conn.last_activity >= timeout:
                    self._kick(conn, f"idle for {now - conn.last_activity:.1f}s")

    def _register(self, identity: bytes, fd: int, part: zmq.Frame) -> ZmqServerConnection:
        old = self._by_identity.get(identity)
        if old is not None:  # same identity, new TCP connection: the old one is gone
            self._lost(old)
        if fd >= 0:
            previous = self._by_fd.get(fd)
            if previous is not None:  # the fd was reused, so its previous owner closed
                self._lost(previous)
        try:
            peer = part.get("Peer-Address")
        except (zmq.ZMQError, UnicodeDecodeError):
            peer = "?"
        conn = ZmqServerConnection(self, next(self._ids), identity, fd, peer)
        self._by_identity[identity] = conn
        if fd >= 0:
            self._by_fd[fd] = conn
        self._connections[conn.id] = conn
        return conn

    def _on_monitor_event(self, msg: list[zmq.Frame]) -> None:
        event = parse_monitor_message([p.bytes for p in msg])
        if event["event"] & curve.HANDSHAKE_FAILED:
            curve.note_server_handshake_failure(self.handshake_failures, event["event"], int(event["value"]))
        elif event["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_ACCEPTED):
            # DISCONNECTED: that peer is gone. ACCEPTED on an fd we still map: its previous owner
            # closed without a DISCONNECTED (the fd could not be reused otherwise).
            conn = self._by_fd.get(int(event["value"]))
            if conn is not None:
                self._lost(conn)

    def _lost(self, conn: ZmqServerConnection) -> None:
        if conn._closed:
            return
        conn._closed = True
        if self._by_identity.get(conn.identity) is conn:
            del self._by_identity[conn.identity]
        if self._by_fd.get(conn.fd) is conn:
            del self._by_fd[conn.fd]
        self._connections.pop(conn.id, None)
        conn.admission.clear()
        conn.outbox.clear()
        conn.queued = 0
        self._blocked.discard(conn)
        for task in conn.tasks:
            task.cancel()
        try:
            self.handler.connection_lost(conn)
        except Exception:
            log.exception("handler.connection_lost failed for connection %s", conn.id)

    # ------------------------------------------------------------ answering

    def _answer_now(self, conn: ZmqServerConnection, request: wire.Frame) -> bool:
        response = answer_now(self.handler, conn, request)
        if response is not None and type(response) is not wire.Frame:  # the rest must wait
            conn._track(self._loop.create_task(self._serve_rest(conn, request, response)))
            return False
        self._respond(conn, request, response)
        return True

    async def _serve(self, conn: ZmqServerConnection, request: wire.Frame) -> None:
        conn.unstarted -= 1
        try:
            await self._answer(conn, request, None)
        finally:
            conn.admission.finished(wire.HEAD_SIZE + len(request.body))
            conn.last_activity = self._loop.time()

    async def _serve_rest(self, conn: ZmqServerConnection, request: wire.Frame,
                          rest: Awaitable[wire.Frame | None]) -> None:
        try:
            await self._answer(conn, request, rest)
        finally:
            conn.admission.finished(wire.HEAD_SIZE + len(request.body))
            conn.last_activity = self._loop.time()

    async def _answer(self, conn: ZmqServerConnection, request: wire.Frame,
                      rest: Awaitable[wire.Frame | None] | None) -> None:
        self._respond(conn, request, await answer(self.handler, conn, request, rest))

    def _respond(self, conn: ZmqServerConnection, request: wire.Frame, response: wire.Frame | None) -> None:
        if response is None or request.is_oneway or conn._closed:
            return
        response.request_id = request.request_id
        response.flags |= wire.FLAG_RESPONSE
        try:
            buffers = wire.encode(response, self.settings.max_frame_size)
        except FrameTooLargeError as e:
            buffers = wire.encode(request.error_response(e.code, str(e), **plain_details(e.details)))
        self._write(conn.identity, buffers)
        conn.admission.responded(sum(len(b) for b in buffers))
        if conn.admission.blocked:  # look again once this iteration's replies have left
            self._loop.call_soon(conn.admission.retry)

    def _write(self, identity: bytes, buffers: list) -> None:
        """Queue encoded frames for one peer; they leave at the end of this loop iteration."""
        if self._batcher is not None and not self._closed:
            self._batcher.write(identity, buffers)

    def _send_message(self, identity: bytes | None, parts: list, copy: bool) -> None:
        """Send to one peer, now or queued in order in that peer's outbox (its ZeroMQ queue is
        full). A vanished peer is not an error here: ROUTER_MANDATORY refuses the send and the
        monitor reports the peer lost."""
        pump = self._pump
        if pump is None or self._closed:
            return
        conn = self._by_identity.get(identity)  # type: ignore[arg-type]
        message = [identity, *parts]
        if conn is not None and conn.outbox:
            self._queue(conn, message, copy)
            return
        try:
            if pump.try_send(message, copy):
                return
        except zmq.ZMQError:
            return  # EHOSTUNREACH: the peer is gone
        if conn is not None:  # a peer we do not know (being refused) loses what does not fit
            self._queue(conn, message, copy)

    def _queue(self, conn: ZmqServerConnection, message: list, copy: bool) -> None:
        n = sum(len(p) for p in message) - len(message[0])
        conn.outbox.append((message, copy, n))
        conn.queued += n
        self._blocked.add(conn)

    def _send_queued(self) -> bool:
        """Send what peers' outboxes hold, each in order, skipping peers still full. True while
        something is left (the pump then retries soon)."""
        pump = self._pump
        if not self._blocked or pump is None:
            return False
        for conn in list(self._blocked):
            outbox = conn.outbox
            while outbox:
                message, copy, n = outbox[0]
                try:
                    if not pump.try_send(message, copy):
                        break
                except zmq.ZMQError:
                    pass  # the peer is gone: drop it, the monitor reports it lost
                outbox.popleft()
                conn.queued -= n
            if not outbox:
                self._blocked.discard(conn)
                conn.admission.retry()
        return bool(self._blocked)

    # ------------------------------------------------------------ shutdown

    async def close(self) -> None:
        """Stop serving: every peer is reported lost, every task ends, every socket is closed with
        LINGER 0 and the context is terminated."""
        if self._closed:
            return
        if self._idle_task is not None:
            self._idle_task.cancel()
            self._idle_task = None
        tasks = [t for c in self._connections.values() for t in c.tasks]
        if tasks:  # handlers about to finish (a held pull just woken) may still answer
            await asyncio.wait(tasks, timeout=CLOSE_SETTLE)
        if self._batcher is not None:
            self._batcher.flush()  # best effort: LINGER 0 may still drop what is unsent
        for conn in list(self._connections.values()):
            self._lost(conn)
        self._closed = True
        if self._batcher is not None:
            self._batcher.discard()
        for pump in (self._pump, self._monitor_pump):
            if pump is not None:
                pump.close()
        self._pump = self._monitor_pump = None
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._close_sockets(self._sock)
            self._sock = None

    def _close_sockets(self, sock: zmq.Socket) -> None:
        if self.zap is not None:
            self.zap.close()
            self.zap = None
        if self._monitor is not None:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(linger=0)
            self._monitor = None
        sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _nothing() -> None:
    """A ROUTER reads every peer anyway: nothing to resume when a peer's backlog empties."""

