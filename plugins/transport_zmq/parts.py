"""How frames travel as ZeroMQ messages, and the socket options both ends share.

A ZeroMQ message carries **one or more whole frames** (equeue_core.frame, length prefix included),
back to back: its parts, concatenated, are exactly those frames' bytes. Frames written to the same
peer during one event-loop iteration leave as one message (`FrameBatcher`), because each ZeroMQ
send costs far more than the bytes it moves. Small buffers are joined into one part; a buffer of
at least `SPLIT_AT` bytes (a large body) is its own part, sent without a copy. The ROUTER side
adds the peer identity as the first part, as ROUTER sockets do.

Limits: a part is at most `max_frame_size` (ZMQ_MAXMSGSIZE on the server drops a peer that sends a
bigger one); a batch is flushed once it holds `FLUSH_BYTES`, so a message holds at most one large
frame plus small ones; a receiver refuses, without joining it, a message over
`max_frame_size + FLUSH_BYTES + SPLIT_AT`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import zmq

from equeue_core import frame as wire
from equeue_core.errors import FrameTooLargeError, ProtocolError

SPLIT_AT = 64 * 1024  # buffers this large are sent as their own part, uncopied
FLUSH_BYTES = 256 * 1024  # a batch this large is sent at once instead of at the end of the iteration
# Messages queued per peer, both directions, on every socket (set_common_options). The server's
# ROUTER then lowers its SNDHWM to max_connection_bytes / (2 * FLUSH_BYTES), at least 2, so replies
# a peer does not read wait in that peer's own outbox (server.py); its RCVHWM stays this large on
# purpose (a small one makes libzmq 4.3.5 abort the process, docs/protocol.md "Limits per connection").
HWM = 100_000

Head = tuple[int, int, int, int, int, int, int, int]


def message_parts(buffers: list, identity: bytes | None = None) -> tuple[list, bool]:
    """(parts, copy) for `send_multipart`: small buffers joined, large ones as their own part."""
    parts: list = [] if identity is None else [identity]
    small: list = []
    copy = True
    for b in buffers:
        if len(b) >= SPLIT_AT:
            if small:
                parts.append(small[0] if len(small) == 1 else b"".join(small))
                small = []
            parts.append(b)
            copy = False
        else:
            small.append(b)
    if small:
        parts.append(small[0] if len(small) == 1 else b"".join(small))
    return parts, copy


def max_message(max_frame: int) -> int:
    return max_frame + FLUSH_BYTES + SPLIT_AT


def parse_message(parts: Sequence[zmq.Frame], max_frame: int,
                  on_frame: Callable[[wire.Frame], None],
                  on_error: Callable[[Head | None, ProtocolError], None]) -> None:
    """Cut a message into frames and hand each to `on_frame`, in order.

    A frame over `max_frame`, or one that does not decode, goes to `on_error` with its head and the
    next frame is tried (the length prefix still says where it ends). A head that is unreadable
    (too short, bad magic/version, length shorter than a head) or a frame running past the end of
    the message ends the message: `on_error(head or None, err)` and the rest is dropped.
    """
    total = 0
    for p in parts:
        total += len(p)
    if total > max_message(max_frame):
        first = parts[0].buffer if parts else memoryview(b"")
        head = _head(first) if len(first) >= wire.HEAD_SIZE else None
        on_error(head, FrameTooLargeError(f"message of {total} bytes is over the maximum of "
                                          f"{max_frame}", size=total, max=max_frame))
        return
    mv = parts[0].buffer if len(parts) == 1 else memoryview(b"".join(p.buffer for p in parts))
    off, end = 0, len(mv)
    if end == 0:
        on_error(None, ProtocolError("empty message"))
        return
    while off < end:
        if end - off < wire.HEAD_SIZE:
            on_error(None, ProtocolError(f"{end - off} bytes left are shorter than a frame head"))
            return
        head = _head(mv[off:off + wire.HEAD_SIZE])
        if head is None:
            on_error(None, ProtocolError("bad frame magic/version"))
            return
        size = head[0] + wire.LENGTH_SIZE
        if size > max_frame:
            on_error(head, FrameTooLargeError(f"frame of {size} bytes is over the maximum of "
                                              f"{max_frame}", size=size, max=max_frame))
            off += size
            continue
        if head[0] < wire.HEAD_SIZE - wire.LENGTH_SIZE:
            on_error(head, ProtocolError(f"frame length {head[0]} is shorter than the frame head"))
            return
        if off + size > end:
            on_error(head, ProtocolError(f"frame of {size} bytes runs past the end of the message"))
            return
        try:
            frame = decode(mv[off:off + size])
        except ProtocolError as e:
            on_error(head, e)
        else:
            on_frame(frame)
        off += size


def _head(buf: memoryview) -> Head | None:
    h = wire.HEAD.unpack_from(buf, 0)
    return h if h[1] == wire.MAGIC and h[2] == wire.VERSION else None


def decode(data: memoryview) -> wire.Frame:
    """`frame.decode`, but every failure is a ProtocolError. The kernel's decode already maps
    hostile headers (deeply nested, non-UTF-8 keys, wrong types) to ProtocolError; this is a
    second net so no other exception from a header can take the receive loop down."""
    try:
        return wire.decode(data)
    except ProtocolError:
        raise
    except (RecursionError, UnicodeDecodeError, ValueError, TypeError, OverflowError) as e:
        raise ProtocolError(f"frame header does not decode: {type(e).__name__}: {e}") from None


class FrameBatcher:
    """Encoded frames written to the same peer in one loop iteration leave as one message.

    `send(identity, parts, copy)` is the socket's send (the pump's), called at the end of the
    iteration or as soon as a peer's batch reaches FLUSH_BYTES. Order per peer is kept.
    """

    def __init__(self, send: Callable[[bytes | None, list, bool], object]) -> None:
        self._send = send
        self._loop = asyncio.get_running_loop()
        self._pending: dict[bytes | None, list] = {}
        self._sizes: dict[bytes | None, int] = {}
        self._scheduled = False

    def write(self, identity: bytes | None, buffers: list) -> None:
        batch = self._pending.get(identity)
        if batch is None:
            batch = self._pending[identity] = []
            self._sizes[identity] = 0
        batch += buffers
        size = self._sizes[identity] = self._sizes[identity] + sum(len(b) for b in buffers)
        if size >= FLUSH_BYTES:
            del self._pending[identity], self._sizes[identity]
            self._send(identity, *message_parts(batch))
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def pending_bytes(self, identity: bytes | None) -> int:
        """Bytes written for `identity` in this iteration, not yet handed to the socket."""
        return self._sizes.get(identity, 0)

    def flush(self) -> None:
        self._scheduled = False
        pending, self._pending, self._sizes = self._pending, {}, {}
        for identity, batch in pending.items():
            self._send(identity, *message_parts(batch))

    def discard(self) -> None:
        self._pending.clear()
        self._sizes.clear()


def error_for_head(head: Head, err: ProtocolError) -> wire.Frame:
    """The error response to the request whose head is `head` (its code and request id)."""
    return wire.Frame(head[3], head[6], head[4]).error_response(err.code, str(err), **err.details)


def set_common_options(sock: zmq.Socket, socket_buffer: int, heartbeat_ivl: float,
                       heartbeat_timeout: float) -> None:
    """LINGER 0 (close never waits on unsent data), bounded queues, big kernel buffers, and ZMTP
    heartbeats so a silent peer is disconnected after `heartbeat_timeout` seconds."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)
    if socket_buffer > 0:
        sock.setsockopt(zmq.SNDBUF, socket_buffer)
        sock.setsockopt(zmq.RCVBUF, socket_buffer)
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(heartbeat_ivl * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(heartbeat_timeout * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TTL, max(100, int(heartbeat_timeout * 1000)))
