"""A blocking TCP (or TLS) client connection: one request at a time, in the caller's own thread.

Why: a synchronous `send` that goes through the client's asyncio loop thread pays two thread
hand-offs per round trip (caller -> loop, loop -> caller), and while the caller's thread keeps the
GIL busy the loop thread barely runs. Here the caller writes the frame and waits for the answer on
its own socket: the only wait is `recv`, which releases the GIL. Same frames, same framing
(equeue_core.frame) as the asyncio connection.

Guarantees:
- `request` ends in exactly one of: the response frame with its request id (an error-flagged
  response is returned as a Frame, the caller maps it), RequestTimeoutError, ConnectionLostError,
  FrameTooLargeError (nothing written).
- After a timeout or a lost connection the socket is closed (its byte stream may be out of step);
  the next request connects again. A connection the server closed while idle (idle_timeout) is
  noticed before writing, so the request goes out on a fresh connection instead of failing: that
  check (one non-blocking peek) is made when the connection was idle for STALE_CHECK_AFTER_S, not
  before every request of a busy sender (a server closes only connections idle far longer).
- Push frames and responses to earlier, timed-out request ids are read and dropped.
- Not thread-safe: the owner serializes requests (equeue_core.client.direct does).
- `request_encoded(..., spin=True)` waits for the answer checking without blocking first (up to
  ANSWER_SPIN_S), then as above: same answers and errors, sooner.

Pipelined use (contracts.PipelinedBlockingConnection; the LitePullConsumer's held pulls): `write`
sends a request without waiting and returns its request id; `read` returns the next frame that
arrives (any request id) or None when none came within its timeout, and keeps the connection (and
a partly received frame) as it is on that timeout, so the requests in flight are still answered;
`interrupt` (the one call allowed from another thread) ends a `read` that waits.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable

from equeue_plugins.transport_tcp.server import tune_socket

from equeue_core import frame as wire
from equeue_core import spin_credit
from equeue_core.contracts import TransportSettings
from equeue_core.errors import ConnectionLostError, EQueueError, RequestTimeoutError, TransportError

RECV_SIZE = 64 * 1024
JOIN_BELOW = 16 * 1024  # request_encoded joins a body below this into one buffer (one send)
STALE_CHECK_AFTER_S = 0.2  # idle this long: peek for a close by the server before writing
# A read keeps the socket's timeout when it is at most this much longer than asked: a poll loop
# asks for a slightly different remaining time on every call, and two setsockopt calls per read
# cost more than the wait they would trim.
READ_TIMEOUT_SLACK = 0.005
_PEEK = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: or-ing the enum flags per call costs ~2 us
# Waiting for an answer the server gives at once (request_encoded(..., spin=True): a producer's
# SEND), the caller's thread first peeks at the socket for up to this long before it blocks in
# recv. Why: on a VM a thread blocked in recv on an idle vCPU is woken by an IPI to a halted vCPU,
# and a bare round trip here took 81 us blocking against 26 us with the client spinning, more
# than the broker's work (docs/benchmarks.md, "The answer spin"). A thread that is still running
# needs no wake-up, and the server's write then wakes nobody. The caller pays with its CPU for
# the wait. Environment EQUEUE_ANSWER_SPIN_US (0: never spin).
ANSWER_SPIN_S = float(os.environ.get("EQUEUE_ANSWER_SPIN_US", "200")) / 1e6
# ...and only for a caller that sends back to back: its last SPIN_STREAK requests each began
# (before their write) within SPIN_AFTER_S of the previous answer. Its thread is busy anyway, so
# the spin costs it little; a caller that sleeps between requests would pay the whole spin in
# CPU, on a small machine taken from the broker and the consumers (the push Consumer's p99 went
# from 0.6 to 2 ms with every paced send spinning; docs/benchmarks.md, "The answer spin").
SPIN_AFTER_S = 20e-6
SPIN_STREAK = 16
# Each empty peek yields the vCPU (sched_yield) to any thread waiting for it. A paced sender
# that falls behind (a sleep overshoots) sends back to back and spins while it catches up, which
# is when the broker and the consumers need the CPU most: without the yield its push Consumer's
# p99 went from 0.5-0.7 to 1.0-2.0 ms. A spinning thread that yields still keeps its vCPU out of
# halt when nobody else wants it, which is all the spin is for.
# The spin only pays while answers come within it (equeue_core/spin_credit.py): each caught
# answer earns a credit (up to SPIN_CREDIT_MAX), each miss costs SPIN_MISS_COST, and at zero the
# connection stops spinning and tries again after SPIN_RETRY_AFTER requests. A server that answers
# slowly (flush=sync, a far host) costs one spin in SPIN_RETRY_AFTER requests, not one per request.
SPIN_CREDIT_MAX = spin_credit.CREDIT_MAX
SPIN_MISS_COST = spin_credit.MISS_COST
SPIN_RETRY_AFTER = spin_credit.RETRY_AFTER


def peeked(sock: socket.socket, buf: bytearray) -> Callable[[], bool]:
    """A check for `spin_until` on a plain socket: True once bytes (or the connection's end) are
    there to read, found with a non-blocking MSG_PEEK into `buf` (one byte, left unread)."""
    peek = sock.recv_into

    def arrived() -> bool:
        try:
            peek(buf, 1, _PEEK)
        except BlockingIOError:
            return False
        return True

    return arrived


def polled(sock: ssl.SSLSocket) -> Callable[[], bool]:
    """The check for `spin_until` on a TLS socket, which cannot peek: True once the TLS layer
    holds decrypted bytes, or bytes still encrypted are in the kernel (a record not all there yet,
    or not application data, makes the read that follows wait)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poll = poller.poll
    pending = sock.pending

    def arrived() -> bool:
        return bool(pending() or poll(0))

    return arrived


def spin_until(arrived: Callable[[], bool], seconds: float) -> bool:
    """Call `arrived` until it is True (return True) or `seconds` ran out (False), yielding the
    vCPU (sched_yield) between calls. A yield that let others run past the window counts as out
    of time: a busy CPU, where blocking lets the answer's wake-up preempt them sooner."""
    clock = time.perf_counter
    give_way = os.sched_yield
    end = clock() + seconds
    while not arrived():
        give_way()
        if clock() >= end:
            return False
    return True


class BlockingTcpConnection:
    """Requests over a blocking socket (see the module docstring)."""

    def __init__(self, host: str, port: int, settings: TransportSettings,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.settings = settings
        self._tls = tls
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._timeout: float | None = None  # the socket's current timeout
        self._buf = bytearray()  # received bytes not yet cut into frames (normally empty)
        self._rbuf = bytearray(RECV_SIZE)  # what recv_into fills
        self._rview = memoryview(self._rbuf)
        self._used = 0.0  # time.monotonic() of the last response
        self._arrived: Callable[[], bool] = bool  # the spin's check of this socket (made at connect)
        self._spin_credit = spin_credit.SpinCredit()  # see ANSWER_SPIN_S
        self._answered = 0.0  # time.perf_counter() when the last answer was read
        self._streak = 0  # requests in a row that came within SPIN_AFTER_S of the last answer
        self.spins_caught = 0  # answers that arrived while the caller spun
        self.spins_missed = 0  # spins that ran out, then blocked

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the socket (TransportError if that fails within connect_timeout)."""
        self.close()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.settings.connect_timeout)
        except OSError as e:
            raise TransportError(f"cannot connect to {self.address}: {e}") from None
        try:
            tune_socket(sock, 0)  # TCP_NODELAY; small frames, default buffers
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except (OSError, ssl.SSLError) as e:
            sock.close()
            raise TransportError(f"cannot connect to {self.address}: {e}") from None
        self._arrived = polled(sock) if self._tls is not None else peeked(sock, bytearray(1))
        self._sock = sock
        self._timeout: float | None = None
        self._buf.clear()

    def _stale(self, sock: socket.socket) -> bool:
        """True if the server closed this idle connection (idle_timeout): EOF is readable before we
        wrote anything. One non-blocking peek; a TLS socket is not checked (a retry covers it)."""
        if isinstance(sock, ssl.SSLSocket):
            return False
        try:
            return not sock.recv(1, _PEEK)
        except BlockingIOError:
            return False  # nothing to read: the usual case
        except OSError:
            return True

    def request(self, frame: wire.Frame, timeout: float) -> wire.Frame:
        """Send `frame` as a request and wait for its response (see the module docstring)."""
        request_id = next(self._ids)
        frame.request_id = request_id
        frame.flags &= ~(wire.FLAG_ONEWAY | wire.FLAG_RESPONSE | wire.FLAG_PUSH)
        buffers = wire.encode(frame, self.settings.max_frame_size)  # FrameTooLargeError: nothing sent
        return self._exchange(request_id, buffers, timeout)

    def request_encoded(self, code: int, header: bytes, body: bytes | bytearray | memoryview,
                        timeout: float, spin: bool = False) -> wire.Frame:
        """`request` of a frame whose header map the caller encoded (frame.encode_header) and may
        reuse: a producer's SEND header is the same for every send to a queue. Same guarantees;
        a small frame leaves as one buffer (one plain send). `spin`: the server usually answers
        at once, so wait for the answer spinning first (ANSWER_SPIN_S)."""
        request_id = next(self._ids)
        buffers = wire.encode_parts(code, request_id, 0, header, body, self.settings.max_frame_size,
                                    JOIN_BELOW)  # FrameTooLargeError: nothing sent
        return self._exchange(request_id, buffers, timeout, spin)

    def _reconnect(self) -> socket.socket:
        """Connect (again) and return the socket; ConnectionLostError if that fails."""
        try:
            self.connect()
        except TransportError as e:
            raise ConnectionLostError(str(e)) from None
        assert self._sock is not None
        return self._sock

    def _exchange(self, request_id: int, buffers: list, timeout: float, spin: bool = False) -> wire.Frame:
        """Write the encoded request `request_id` and wait for its response."""
        now = time.monotonic()
        sock = self._sock
        if sock is not None and now - self._used > STALE_CHECK_AFTER_S and self._stale(sock):
            self.close()
            sock = None
        if sock is None:
            sock = self._reconnect()
        deadline = now + timeout
        began = time.perf_counter() if spin else 0.0  # see SPIN_AFTER_S
        try:
            if timeout != self._timeout:
                self._set_timeout(sock, timeout)
            if len(buffers) == 1:
                sock.sendall(buffers[0])  # a small request (request_encoded joins it), as _write does
            else:
                self._write(sock, buffers)
            if spin and ANSWER_SPIN_S:
                self._spin(began)
            while True:
                response = self._read_frame(sock, deadline)
                if response.request_id == request_id and not response.flags & wire.FLAG_PUSH:
                    # used since the request began: idle time counts from a moment no later
                    # than the answer, so the stale check below never comes later than before
                    self._used = now
                    if spin:
                        self._answered = time.perf_counter()
                    return response
        except (TimeoutError, BlockingIOError):  # BlockingIOError: SO_RCVTIMEO ran out
            self.close()
            raise RequestTimeoutError(f"no response to request {request_id} within {timeout}s",
                                      request_id=request_id, timeout=timeout) from None
        except (OSError, ssl.SSLError) as e:
            self.close()
            raise ConnectionLostError(f"connection to {self.address} lost: {e}") from None
        except EQueueError:  # lost, or a response that does not decode: out of step either way
            self.close()
            raise

    def _spin(self, began: float) -> None:
        """Check the socket, without blocking and yielding the vCPU between checks, until the
        answer's first bytes are there (or the connection's end: the read that follows reports
        it) or ANSWER_SPIN_S ran out; then the read. Plain tcp peeks (MSG_PEEK); TLS polls the
        socket's fd, after a look at what the TLS layer already decrypted. Left out for a caller
        that is not sending back to back (SPIN_STREAK; `began`: perf_counter() before the
        request's write) and while the spin stops catching answers (SPIN_CREDIT_MAX)."""
        if began - self._answered >= SPIN_AFTER_S:
            self._streak = 0
            return
        if self._streak < SPIN_STREAK:
            self._streak += 1
            return
        credit = self._spin_credit
        if not credit.allows():
            return
        if spin_until(self._arrived, ANSWER_SPIN_S):
            self.spins_caught += 1
            credit.caught()
        else:
            self.spins_missed += 1
            credit.missed()

    def _set_timeout(self, sock: socket.socket, timeout: float) -> None:
        """A plain socket stays in blocking mode with kernel timeouts (SO_RCVTIMEO/SO_SNDTIMEO), so
        a send or recv is one system call (Python's own socket timeout adds a poll() to each); set
        once per timeout value. A TLS socket uses Python's timeout."""
        if timeout == self._timeout:
            return
        if isinstance(sock, ssl.SSLSocket):
            sock.settimeout(timeout)
        else:
            sock.settimeout(None)
            tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1_000_000))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self._timeout = timeout

    @staticmethod
    def _write(sock: socket.socket, buffers: list) -> None:
        """Write the frame's buffers (head+header, body) without joining them: one sendmsg, and
        sendall for whatever the kernel did not take (a TLS socket joins them)."""
        if isinstance(sock, ssl.SSLSocket) or len(buffers) == 1:
            sock.sendall(b"".join(buffers) if len(buffers) > 1 else buffers[0])
            return
        sent = sock.sendmsg(buffers)
        total = len(buffers[0]) + len(buffers[1])
        if sent < total:
            sock.sendall(b"".join(buffers)[sent:])

    def _read_frame(self, sock: socket.socket, deadline: float) -> wire.Frame:
        buf = self._buf
        if not buf:
            # The usual answer: one recv brings exactly one whole frame. It is decoded from a copy
            # of just its bytes (the Frame may keep its body), with no bytearray in between.
            n = self._receive(sock, self._rbuf)
            view = self._rview
            if wire.HEAD_SIZE <= n <= self.settings.max_frame_size:
                head = wire.HEAD.unpack_from(view, 0)
                if head[0] + wire.LENGTH_SIZE == n and head[1] == wire.MAGIC and head[2] == wire.VERSION:
                    # exactly one whole frame with a good head: decoded with the head read once
                    return wire.decode_checked(head, view[:n].tobytes())
            if n >= wire.LENGTH_SIZE and wire.frame_length(view[:wire.LENGTH_SIZE],
                                                          self.settings.max_frame_size) + wire.LENGTH_SIZE == n:
                return wire.decode(view[:n].tobytes())
            buf += view[:n]
        while True:
            if len(buf) >= wire.LENGTH_SIZE:
                need = wire.frame_length(buf[:wire.LENGTH_SIZE], self.settings.max_frame_size) + wire.LENGTH_SIZE
                if len(buf) >= need:
                    data = buf[:need]  # the frame's own copy (its body stays a view of it)
                    del buf[:need]
                    return wire.decode(data)
                return self._read_rest(sock, need, deadline)
            if buf and time.monotonic() > deadline:  # a frame trickling in slower than the timeout
                raise TimeoutError
            buf += self._rview[:self._receive(sock, self._rbuf)]

    def _receive(self, sock: socket.socket, into: bytearray | memoryview) -> int:
        """One recv_into: the bytes it brought (ConnectionLostError when the server closed)."""
        n = sock.recv_into(into)
        if not n:
            raise ConnectionLostError(f"connection to {self.address} closed by the server")
        return n

    def _read_rest(self, sock: socket.socket, need: int, deadline: float) -> wire.Frame:
        """The rest of a frame of `need` bytes whose start is in self._buf, received straight into
        a buffer of its own (one copy out of the kernel; a pull answer of 1024 messages is ~130
        KB, and growing self._buf chunk by chunk copied it three more times). Reads no further
        than the frame's end, so the next frame's read starts clean. On a timeout (or any error)
        what arrived goes back to self._buf for the next read."""
        buf = self._buf
        frame = bytearray(need)
        view = memoryview(frame)
        have = len(buf)
        view[:have] = buf
        buf.clear()
        try:
            while have < need:
                if time.monotonic() > deadline:  # a frame trickling in slower than the timeout
                    raise TimeoutError
                have += self._receive(sock, view[have:])
        except BaseException:
            buf += view[:have]
            raise
        return wire.decode(frame)

    # ------------------------------------------------------------ pipelined use

    def write(self, frame: wire.Frame) -> int:
        """Send `frame` as a request without waiting for its answer; its request id. Connects
        first if needed (ConnectionLostError if that fails); FrameTooLargeError: nothing sent."""
        return self.write_many([frame])[0]

    def write_many(self, frames: list[wire.Frame]) -> list[int]:
        """`write` for several requests at once: one system call for all of them (the
        LitePullConsumer's pulls gathered in one poll); their request ids, in order. Every
        frame is encoded before anything is written (FrameTooLargeError: nothing sent). More than
        two buffers (a frame encodes to one, or two with a body) are joined into one first (their
        bodies copied: meant for small frames such as pulls; and never more buffers than one
        sendmsg takes)."""
        if not frames:
            return []
        ids = []
        buffers: list = []
        for frame in frames:
            request_id = next(self._ids)
            frame.request_id = request_id
            frame.flags &= ~(wire.FLAG_ONEWAY | wire.FLAG_RESPONSE | wire.FLAG_PUSH)
            buffers += wire.encode(frame, self.settings.max_frame_size)
            ids.append(request_id)
        if len(buffers) > 2:
            buffers = [b"".join(buffers)]
        sock = self._sock if self._sock is not None else self._reconnect()
        try:
            self._write(sock, buffers)
        except (OSError, ssl.SSLError) as e:
            self.close()
            raise ConnectionLostError(f"connection to {self.address} lost: {e}") from None
        return ids

    def read(self, timeout: float) -> wire.Frame | None:
        """The next frame from the server (a response to any request id, or a push), or None if
        none arrived within `timeout` seconds (at least 1 ms, at most READ_TIMEOUT_SLACK more).
        ConnectionLostError (the socket is
        closed) if the connection broke or `interrupt` was called."""
        sock = self._sock
        if sock is None:
            raise ConnectionLostError(f"not connected to {self.address}")
        timeout = max(0.001, timeout)
        try:
            current = self._timeout
            if current is None or not timeout <= current <= timeout + READ_TIMEOUT_SLACK:
                self._set_timeout(sock, timeout)
            return self._read_frame(sock, time.monotonic() + timeout)
        except (TimeoutError, BlockingIOError):
            return None  # what arrived of a frame stays in self._buf for the next read
        except (OSError, ssl.SSLError) as e:
            self.close()
            raise ConnectionLostError(f"connection to {self.address} lost: {e}") from None
        except EQueueError:
            self.close()
            raise

    def interrupt(self) -> None:
        """End a `read` waiting in another thread (it raises ConnectionLostError): shut the
        socket down (a plain close would leave that thread's recv waiting)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._buf.clear()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
