"""How a frame travels as a ZeroMQ message, and the socket options both ends share.

A frame (equeue_core.frame, length prefix included) is carried as one ZeroMQ message whose parts,
concatenated, are exactly the frame's bytes. Small frames go as one part; a frame whose body is at
least `SPLIT_AT` bytes goes as two (head+header, body), with the body sent without a copy. The
ROUTER side adds the peer identity as the first part, as ROUTER sockets do.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

from equeue_core import frame as wire
from equeue_core.errors import FrameTooLargeError, ProtocolError

SPLIT_AT = 64 * 1024  # bodies this large are sent as their own part, uncopied
HWM = 100_000  # messages queued per peer before a send waits (bounded, but far above 1000 in flight)

Head = tuple[int, int, int, int, int, int, int, int]


def frame_parts(frame: wire.Frame, max_frame: int) -> tuple[list, bool]:
    """(parts, copy) for `send_multipart`. FrameTooLargeError (nothing sent) over `max_frame`."""
    buffers = wire.encode(frame, max_frame)
    if len(buffers) == 1:
        return buffers, True
    if len(buffers[1]) >= SPLIT_AT:
        return buffers, False
    return [b"".join(buffers)], True


def parse_parts(parts: Sequence[zmq.Frame], max_frame: int) -> wire.Frame:
    """Decode a message's parts as one frame. Raises FrameTooLargeError (before joining anything)
    when the parts add up to more than `max_frame`, ProtocolError when they do not decode; both
    carry `.head` (the parsed head tuple, or None if even the head is unreadable)."""
    total = 0
    for p in parts:
        total += len(p)
    first = parts[0].buffer if parts else memoryview(b"")
    head: Head | None = None
    start = first
    if len(first) < wire.HEAD_SIZE and len(parts) > 1:  # the head may straddle parts
        start = memoryview(b"".join(p.buffer for p in parts[:wire.HEAD_SIZE])[:wire.HEAD_SIZE])
    if len(start) >= wire.HEAD_SIZE:
        h = wire.HEAD.unpack_from(start, 0)
        if h[1] == wire.MAGIC and h[2] == wire.VERSION:
            head = h
    if total > max_frame:
        err: ProtocolError = FrameTooLargeError(
            f"frame of {total} bytes is over the maximum of {max_frame}", size=total, max=max_frame)
        err.head = head  # type: ignore[attr-defined]
        raise err
    data = first if len(parts) == 1 else b"".join(p.buffer for p in parts)
    try:
        return wire.decode(data)
    except ProtocolError as e:
        e.head = head  # type: ignore[attr-defined]
        raise
    except (RecursionError, UnicodeDecodeError, ValueError, TypeError, OverflowError) as e:
        # The kernel's decode lets these escape on hostile headers (deeply nested msgpack, a key
        # that is not UTF-8); here they are what they are: a frame that does not decode.
        err = ProtocolError(f"frame header does not decode: {type(e).__name__}: {e}")
        err.head = head  # type: ignore[attr-defined]
        raise err from None


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


def plain(details: dict) -> dict:
    """Error details as msgpack-safe values (anything else becomes its str)."""
    return {str(k): v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
            for k, v in details.items()}
