"""Driving a plain (synchronous) ZeroMQ socket from an asyncio event loop, without zmq.asyncio.

Why: zmq.asyncio wraps every send and receive in a Future and re-polls through the loop; measured
here it managed about a fifth of the round trips of the same sockets driven directly. This pump
watches the socket's ZMQ_FD with `loop.add_reader` and does the edge-triggered dance libzmq asks
for: the FD only says "something changed", so after *every* operation on the socket we read
ZMQ_EVENTS and, if a message is waiting, handle it on the next loop iteration instead of waiting
for an edge that will not come.

What it guarantees:
- `on_message` is called for every message, in arrival order, on the loop thread; at most `BATCH`
  messages per loop iteration, so one busy socket cannot starve the loop.
- `send` never blocks: it sends now or queues in order (ZeroMQ said EAGAIN: the peer's queue is
  full, or with ZMQ_IMMEDIATE there is no connection yet). Queued sends go out in order as soon as
  the socket accepts them; a queued send whose Future was cancelled is skipped.
- `try_send` sends now or says EAGAIN and leaves the message with the caller, who keeps its own
  queues (the ROUTER server keeps one per peer) and is called back through `on_writable` on every
  wake-up, retries included, until it reports nothing left.
- After `close()` nothing is called and the FD is no longer watched (close the socket after).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

import zmq

log = logging.getLogger(__name__)

BATCH = 1024  # messages handled per loop iteration before yielding
RETRY = 0.01  # seconds between retries of a queued send (safety net for a missed POLLOUT edge)


class SocketPump:
    """Reads and writes one ZeroMQ socket on the running loop (see the module docstring)."""

    def __init__(self, sock: zmq.Socket, on_message: Callable[[list[zmq.Frame]], None],
                 before_batch: Callable[[], None] | None = None,
                 on_writable: Callable[[], bool] | None = None) -> None:
        self.sock = sock
        self.on_message = on_message
        self.before_batch = before_batch
        # Called on every wake-up (socket events and retries) to send what the owner queued
        # itself; returns True while something is still queued (then retries are armed).
        self.on_writable = on_writable
        self.loop = asyncio.get_running_loop()
        self._fd = sock.getsockopt(zmq.FD)
        self._outbox: deque[tuple[list, bool, asyncio.Future]] = deque()
        self._scheduled = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        self.loop.add_reader(self._fd, self._on_events)
        self._schedule()  # messages may already be waiting, and no edge would tell us

    @property
    def queued(self) -> int:
        """Sends waiting for the socket to accept them."""
        return len(self._outbox)

    def send(self, parts: list, copy: bool = True) -> asyncio.Future | None:
        """Send a multipart message. None: it went out now. A Future: it is queued; it resolves
        when sent, fails with the ZMQError if ZeroMQ refuses it, and cancelling it withdraws it."""
        if self._closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "socket pump is closed")
        if not self._outbox:
            try:
                self.sock.send_multipart(parts, zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                pass
            else:
                self._check_in()
                return None
        fut = self.loop.create_future()
        self._outbox.append((parts, copy, fut))
        self._arm_retry()
        self._check_in()
        return fut

    def try_send(self, parts: list, copy: bool = True) -> bool:
        """Send now if ZeroMQ takes it: True if sent, False on EAGAIN (full peer queue; the
        caller keeps the message and is called back through `on_writable`). Other ZMQErrors
        are raised."""
        try:
            self.sock.send_multipart(parts, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            self.arm_retry()
            return False
        finally:
            self._check_in()
        return True

    def arm_retry(self) -> None:
        """Wake up again in RETRY seconds (a full peer queue gives no event when it drains)."""
        self._arm_retry()

    def close(self) -> None:
        """Stop watching the socket; queued sends are cancelled."""
        if self._closed:
            return
        self._closed = True
        try:
            self.loop.remove_reader(self._fd)
        except (ValueError, OSError):
            pass
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        while self._outbox:
            self._outbox.popleft()[2].cancel()

    # ------------------------------------------------------------ internals

    def _check_in(self) -> None:
        """After any operation: if a message is already waiting, the FD may never signal it."""
        if not self._scheduled and self.sock.get(zmq.EVENTS) & zmq.POLLIN:
            self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and not self._closed:
            self._scheduled = True
            self.loop.call_soon(self._on_events)

    def _arm_retry(self) -> None:
        if self._retry is None and not self._closed:
            self._retry = self.loop.call_later(RETRY, self._on_retry)

    def _on_retry(self) -> None:
        self._retry = None
        self._on_events()

    def poll(self) -> None:
        """Handle whatever the socket has now, synchronously (e.g. monitor events before data)."""
        self._on_events()

    def _on_events(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        if self.before_batch is not None:
            self.before_batch()
        sock = self.sock
        if self._outbox:
            self._flush()
        if self.on_writable is not None and self.on_writable():
            self._arm_retry()
        for _ in range(BATCH):
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            except zmq.ZMQError as e:
                if self._closed:
                    return
                log.warning("zmq receive failed: %s", e)
                break
            self.on_message(msg)
            if self._closed:
                return
        else:
            self._schedule()  # more waiting: let the rest of the loop run first
            return
        if self._outbox:
            self._flush()
        self._check_in()

    def _flush(self) -> None:
        outbox = self._outbox
        sock = self.sock
        while outbox:
            parts, copy, fut = outbox[0]
            if fut.done():  # withdrawn (cancelled) by its sender
                outbox.popleft()
                continue
            try:
                sock.send_multipart(parts, zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                self._arm_retry()
                return
            except zmq.ZMQError as e:
                outbox.popleft()
                fut.set_exception(e)
                continue
            outbox.popleft()
            fut.set_result(None)
