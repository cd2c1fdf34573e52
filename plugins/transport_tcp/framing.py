"""Cutting a TCP byte stream into frames, with bounded memory and no trust in the peer.

`FrameReader` is the receive half shared by the server and the client. It is driven by an
`asyncio.BufferedProtocol`: the event loop reads straight into the buffer `get_buffer` returns, and
`feed(n)` parses whatever whole frames are now there. What it guarantees:

- Memory per connection is bounded by what the peer has actually sent of the current frame (at most
  IN_PLACE_RATIO (8) times that, plus a 16 KiB scratch buffer): a head that *announces* 16 MiB pins
  kilobytes, not 16 MiB, and no head alone makes the reader allocate a large buffer.
- A length prefix over `max_frame` is never buffered: the reader reports it (`on_oversized`, with the
  parsed head so the caller can answer that request id) and then discards exactly that many bytes,
  so the stream stays in step and the connection stays usable.
- A frame that is whole but does not decode (bad header msgpack, header length past the frame) is
  reported with its head (`on_bad_frame`); the stream is still in step.
- A head whose magic/version is wrong, or whose length is shorter than a head, means the stream can
  no longer be cut into frames: `on_fatal` is called and the caller closes the connection.
- A large frame is received into a buffer that is then handed to the Frame (its body is a
  memoryview over it), so a 15 MiB body is not copied again after it arrives.
- A large frame of which at least 1/IN_PLACE_RATIO has arrived (a producer's default batch of ~1 MiB:
  once 128 KiB are in) has the rest of its body received straight into one bytearray of exactly
  the body's size: no growth copies past that point, no zero-filled doublings. That bytearray
  becomes `Frame.body` and belongs to the frame alone (nothing else uses it while the frame's
  holders do), so a handler may write into it (the broker stamps a send's records in place).
  Only such a body is a bytearray; every other body is a bytes object or a memoryview. An
  incomplete frame thus pins at most IN_PLACE_RATIO times what arrived, plus the scratch; a
  connection stalled in the middle of it is closed after frame_read_timeout. An idle connection
  still holds the scratch only, plus its spare bodies below.
- A reader given `spares` (the client's connections: SpareBodies) receives large bodies into
  bodies it kept from earlier frames, once nothing else refers to them, and keeps each body it
  delivers for that. A kept body that fits a frame is used as soon as the frame's header is in
  (it costs no new memory, so the 1/IN_PLACE_RATIO rule does not apply to it). Such a connection
  keeps up to SpareBodies' bounds of its recent large bodies (client.py: 32, 32 MiB) for as long
  as it lives. The broker's connections keep none (the broker command keeps freed memory in its
  allocator instead, equeue_core/allocator.py).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable

from equeue_core import frame as wire
from equeue_core.errors import FrameTooLargeError, ProtocolError

SCRATCH_SIZE = 16 * 1024  # initial receive buffer per connection (what an idle connection holds)
MIN_READ = 16 * 1024  # never offer the kernel less room than this
HANDOVER_MIN = 128 * 1024  # frames at least this big keep their receive buffer instead of a copy
# A frame's exact-size body buffer is allocated once 1/IN_PLACE_RATIO of the frame has arrived:
# memory stays proportional to what the peer really sent (an announced size alone allocates nothing
# big), and a 1 MiB batch pays the scratch's growth only up to 128 KiB.
IN_PLACE_RATIO = 8

Head = tuple[int, int, int, int, int, int, int, int]  # wire.HEAD fields

_ZEROS = bytes(1024 * 1024)  # what a reused body grows by (a view of it: no allocation)


def _refs(kept: list[bytearray], i: int) -> int:
    """The reference count of kept[i] as seen from here: the list's, this frame's and the call's.
    The count of a body nobody else refers to is measured once, with this same function
    (_ALONE), so the check holds whatever a CPython version counts for locals."""
    body = kept[i]
    return sys.getrefcount(body)


_ALONE = _refs([bytearray(1)], 0)


class SpareBodies:
    """Received bodies a FrameReader keeps to receive later large frames into: a client reading
    pull answers of 1 KiB messages (~0.5 MiB each) allocated a fresh body for every answer, and
    glibc gave each one fresh pages (its heap top trimmed, or an mmap of its own), so the client
    page-faulted on half the bytes it read (docs/benchmarks.md, "A consumer's page faults on every
    pull answer").

    Guarantees:
    - A body is reused only while nothing but this object refers to it (CPython's reference
      count): the frame it went out with, a PulledBatch, a memoryview or a Py_buffer over it all
      hold a reference, so a body anyone can still read or write is never written again.
    - At most `count` bodies and `max_bytes` of them are kept; past that the oldest is let go.
    - A reused body has exactly the size asked for, as a fresh one does; its bytes are not zeroed
      (the reader overwrites them all before the frame is delivered). It is taken only where
      CPython resizes a bytearray without moving it (between half its allocation and all of it),
      and a new body is allocated with a quarter more room, so answers of similar sizes fit.
    """

    __slots__ = ("count", "max_bytes", "_kept", "_bytes", "reused", "allocated")

    def __init__(self, count: int, max_bytes: int) -> None:
        self.count = count
        self.max_bytes = max_bytes
        self._kept: list[bytearray] = []
        self._bytes = 0
        self.reused = 0  # bodies taken from the kept ones (for tests and stats)
        self.allocated = 0  # bodies allocated because none fitted

    def take(self, size: int) -> bytearray:
        """A bytearray of exactly `size` bytes that nobody else refers to: a kept one, or new."""
        body = self.reuse(size)
        if body is None:
            self.allocated += 1
            body = bytearray(size + size // 4)
            del body[size:]
        return body

    def reuse(self, size: int) -> bytearray | None:
        """A kept body resized to exactly `size` bytes that nobody else refers to, or None."""
        kept = self._kept
        for i in range(len(kept)):
            if _refs(kept, i) == _ALONE:  # referred to by the list alone
                body = kept[i]
                room = body.__alloc__()
                if room // 2 <= size < room and size - len(body) <= len(_ZEROS):
                    del kept[i]
                    self._bytes -= room
                    if size < len(body):
                        del body[size:]
                    elif size > len(body):
                        body += memoryview(_ZEROS)[:size - len(body)]
                    self.reused += 1
                    return body
        return None

    def keep(self, body: bytearray) -> None:
        """`body` went out with a frame: keep it for reuse once its frame is done with it."""
        kept = self._kept
        kept.append(body)
        self._bytes += body.__alloc__()
        while len(kept) > self.count or (self._bytes > self.max_bytes and len(kept) > 1):
            self._bytes -= kept.pop(0).__alloc__()

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def kept_bytes(self) -> int:
        """The memory the kept bodies hold (their allocations), at most `max_bytes` but for one."""
        return self._bytes

    @property
    def idle_bytes(self) -> int:
        """The memory of the kept bodies nobody else refers to any more (what only this keeps)."""
        kept = self._kept
        return sum(kept[i].__alloc__() for i in range(len(kept)) if _refs(kept, i) == _ALONE)


class FrameReader:
    """Incremental frame parser over a growable bytearray (see the module docstring)."""

    __slots__ = ("_buf", "_start", "_end", "_need", "_head", "_discard", "_body", "_got", "_prefix", "max_frame",
                 "on_frame", "on_oversized", "on_bad_frame", "on_fatal", "spares")

    def __init__(self, max_frame: int,
                 on_frame: Callable[[wire.Frame], None],
                 on_oversized: Callable[[Head, FrameTooLargeError], None],
                 on_bad_frame: Callable[[Head, ProtocolError], None],
                 on_fatal: Callable[[ProtocolError], None], spares: SpareBodies | None = None) -> None:
        self.max_frame = max_frame
        # large bodies received in place come from here and go back to it (SpareBodies); None:
        # every body is a fresh bytearray
        self.spares = spares
        self.on_frame = on_frame
        self.on_oversized = on_oversized
        self.on_bad_frame = on_bad_frame
        self.on_fatal = on_fatal
        self._buf = bytearray(SCRATCH_SIZE)
        self._start = 0  # first unparsed byte
        self._end = 0  # one past the last received byte
        self._need = 0  # total size of the frame at _start once its head is parsed, else 0
        self._head: Head = (0, 0, 0, 0, 0, 0, 0, 0)  # that head (checked), while _need is set
        self._discard = 0  # bytes of an oversized frame still to throw away
        self._body: bytearray | None = None  # the current frame's body, received in place (see docstring)
        self._got = 0  # bytes of _body received so far
        self._prefix = b""  # that frame's head and header

    @property
    def partial(self) -> bool:
        """True while part of a frame has arrived and the rest has not (what slow-loris checks)."""
        return self._end > self._start or self._discard > 0 or self._body is not None

    @property
    def buffered(self) -> int:
        """Bytes of memory this reader holds (for tests that check nothing is pinned)."""
        body = self._body
        return len(self._buf) + (len(body) if body is not None else 0)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Room for the next read. Grows only when unparsed data fills the buffer, so capacity
        stays within about 2x what the peer really sent (never the size a head merely claims).
        While a body is received in place, the rest of that body (never more: the next frame's
        bytes land in the scratch)."""
        body = self._body
        if body is not None:
            return memoryview(body)[self._got:]
        buf = self._buf
        if self._discard:
            # Reads of an oversized frame land at the start of the scratch buffer and are dropped.
            self._start = self._end = 0
            return memoryview(buf)
        if len(buf) - self._end < MIN_READ:
            pending = self._end - self._start
            target = len(buf)
            if pending + MIN_READ > len(buf):
                target = max(2 * len(buf), pending + MIN_READ)
                if self._need:  # do not grow past the frame (plus one read of what follows)
                    target = max(min(target, self._need + MIN_READ), pending + MIN_READ)
            if target != len(buf):
                new = bytearray(target)
                new[:pending] = memoryview(buf)[self._start:self._end]
                self._buf = buf = new
            else:
                buf[:pending] = buf[self._start:self._end]
            self._start, self._end = 0, pending
        return memoryview(buf)[self._end:]

    def feed(self, nbytes: int) -> None:
        """`nbytes` were written into the last buffer: parse every whole frame now available."""
        body = self._body
        if body is not None:
            self._got += nbytes
            if self._got == len(body):
                self._deliver_body()
            return
        if self._discard:
            take = min(nbytes, self._discard)
            self._discard -= take
            if self._discard or take == nbytes:
                self._start = self._end = 0
                return
            self._start, self._end = take, nbytes  # what follows the oversized frame
        else:
            self._end += nbytes
        self._parse()

    def feed_lone(self, nbytes: int) -> wire.Frame | None:
        """`feed`'s shortcut for the usual read of a request/response peer: `nbytes` arrived into
        an empty reader and they are exactly one whole, well-formed frame below HANDOVER_MIN.
        Then that frame is returned (consumed: `on_frame` is NOT called for it) and the reader is
        empty again. In any other case (more or less than one frame, something already buffered,
        a bad or oversized head, a header that does not decode) nothing is consumed and None is
        returned: the caller then calls `feed(nbytes)`, which handles it as it always did."""
        if (self._end or self._body is not None or self._discard or nbytes < wire.HEAD_SIZE
                or nbytes >= HANDOVER_MIN):
            return None
        buf = self._buf
        head: Head = wire.HEAD.unpack_from(buf, 0)
        if (head[0] + wire.LENGTH_SIZE != nbytes or head[1] != wire.MAGIC or head[2] != wire.VERSION
                or nbytes > self.max_frame):
            return None
        try:
            return wire.decode_checked(head, bytes(memoryview(buf)[:nbytes]))
        except Exception:  # feed() reports it exactly as before (on_bad_frame)
            return None

    def _parse(self) -> None:
        buf = self._buf
        while True:
            avail = self._end - self._start
            if not self._need:
                if avail < wire.HEAD_SIZE:
                    break
                head: Head = wire.HEAD.unpack_from(buf, self._start)
                if head[1] != wire.MAGIC or head[2] != wire.VERSION:
                    self._reset()
                    self.on_fatal(ProtocolError(f"bad frame magic/version {head[1]:#x}/{head[2]}"))
                    return
                length = head[0]
                try:
                    if length + wire.LENGTH_SIZE > self.max_frame or length < wire.HEAD_SIZE - wire.LENGTH_SIZE:
                        wire.frame_length(memoryview(buf)[self._start:self._start + 4], self.max_frame)
                    self._need = length + wire.LENGTH_SIZE
                    self._head = head
                except FrameTooLargeError as e:
                    skip = head[0] + wire.LENGTH_SIZE - avail
                    if skip > 0:
                        self._discard = skip
                        self._start = self._end = 0
                    else:  # cannot happen with a max frame >= scratch size, but stay exact
                        self._start += head[0] + wire.LENGTH_SIZE
                    self.on_oversized(head, e)
                    if self._discard:
                        return
                    continue
                except ProtocolError as e:
                    self._reset()
                    self.on_fatal(e)
                    return
            need = self._need
            if avail < need:
                header_end = wire.HEAD_SIZE + self._head[7]
                if avail >= header_end and need >= HANDOVER_MIN:
                    if IN_PLACE_RATIO * avail >= need:
                        self._receive_body_in_place(header_end)
                    elif self.spares is not None:
                        # a kept body that fits costs no new memory: the rest goes straight into it
                        # instead of growing the scratch to 1/IN_PLACE_RATIO of the frame first
                        body = self.spares.reuse(need - header_end)
                        if body is not None:
                            self._receive_body_in_place(header_end, body)
                break
            start = self._start
            if start == 0 and need >= HANDOVER_MIN:
                # Give this buffer to the frame; move whatever follows into a fresh scratch buffer.
                data = memoryview(buf)[:need]
                rest = self._end - need
                new = bytearray(max(SCRATCH_SIZE, rest + MIN_READ))
                new[:rest] = memoryview(buf)[need:self._end]
                self._buf = buf = new
                self._start, self._end = 0, rest
            else:
                data = bytes(memoryview(buf)[start:start + need])
                self._start = start + need
                if self._start == self._end:
                    self._start = self._end = 0
            self._need = 0
            try:
                decoded = decode(data, self._head)
            except ProtocolError as e:
                self.on_bad_frame(wire.HEAD.unpack_from(data, 0), e)
                continue
            self.on_frame(decoded)
            if self._buf is not buf:  # a callback closed us and reset the buffer
                return

    def _receive_body_in_place(self, header_end: int, body: bytearray | None = None) -> None:
        """Head and header are in the scratch: move them out, and the body's first bytes into a
        bytearray of exactly the body's size (`body`, or one from the spares, or a new one) that
        the next reads fill (get_buffer)."""
        start, end = self._start, self._end
        src = memoryview(self._buf)
        self._prefix = bytes(src[start:start + header_end])
        if body is None:
            spares = self.spares
            body = bytearray(self._need - header_end) if spares is None else spares.take(self._need - header_end)
        got = end - start - header_end
        body[:got] = src[start + header_end:end]
        self._body, self._got = body, got
        self._start = self._end = 0
        if len(self._buf) > SCRATCH_SIZE:  # a grown scratch goes back to its idle size
            self._buf = bytearray(SCRATCH_SIZE)

    def _deliver_body(self) -> None:
        """The body received in place is complete: hand it over as the frame's body."""
        body, prefix = self._body, self._prefix
        self._body, self._got, self._prefix, self._need = None, 0, b"", 0
        if self.spares is not None:
            self.spares.keep(body)
        try:
            decoded = decode(prefix, self._head)
        except ProtocolError as e:
            self.on_bad_frame(self._head, e)
            return
        self.on_frame(wire.Frame(decoded.code, decoded.request_id, decoded.flags, decoded.header, body))

    def _reset(self) -> None:
        self._start = self._end = self._need = self._discard = self._got = 0
        self._body, self._prefix = None, b""
        self._buf = bytearray(0)


def decode(data: bytes | bytearray | memoryview, head: Head | None = None) -> wire.Frame:
    """`frame.decode`, but every failure is a ProtocolError. With `head` (the frame's head as
    FrameReader unpacked and checked it) the head is not decoded again.

    The kernel's decode already maps hostile headers (deeply nested msgpack, keys that are not
    UTF-8, wrong types) to ProtocolError; this is a second net, so an exception a future msgpack
    version raises for some other header can never take a connection handler down.
    """
    try:
        return wire.decode(data) if head is None else wire.decode_checked(head, data)
    except ProtocolError:
        raise
    except (RecursionError, UnicodeDecodeError, ValueError, TypeError, OverflowError) as e:
        raise ProtocolError(f"frame header does not decode: {type(e).__name__}: {e}") from None


def error_for_head(head: Head, err: ProtocolError) -> wire.Frame:
    """The error response to the request whose head is `head` (its code and request id)."""
    request = wire.Frame(head[3], head[6], head[4])
    return request.error_response(err.code, str(err), **err.details)


# A flush of at least this many bytes goes to a `direct` socket with the GIL released (see
# WriteCoalescer); at most this many buffers at once (one sendmsg, within IOV_MAX).
DIRECT_MIN_BYTES = 64 * 1024
DIRECT_MAX_BUFFERS = 512


def duplicate_socket(transport: object) -> socket.socket | None:
    """A second socket object on a transport's connection (a dup of its descriptor), for writes
    the transport does not make itself; None if the transport has no plain socket to duplicate.
    The caller closes it when the connection is lost."""
    fd = -1
    try:
        fd = os.dup(transport.get_extra_info("socket").fileno())  # type: ignore[attr-defined]
        return socket.socket(fileno=fd)
    except (OSError, AttributeError):
        if fd >= 0:
            os.close(fd)
        return None


def _after(buffers: list, sent: int) -> list:
    """What of `buffers` is left once the kernel took their first `sent` bytes."""
    for i, b in enumerate(buffers):
        n = len(b)
        if sent < n:
            return [memoryview(b)[sent:], *buffers[i + 1:]] if sent else buffers[i:]
        sent -= n
    return []


class WriteCoalescer:
    """Frames written during one event-loop iteration leave in one `writelines` call.

    With many requests in flight, responses (and pipelined requests) complete in bursts; one
    writev per burst instead of one send() per frame was the largest single saving the profile
    showed. Order is kept; buffers are not copied here (uvloop's writelines is a writev; plain
    asyncio joins them). Costs one loop iteration of latency for a lone frame, unless the
    writes happen between `hold()` and `release()` (the server answering the frames of one read
    in that read's callback): then they leave at `release()`, with no extra loop iteration and no
    scheduled callback. `after_flush` (if given) runs after every flush that handed bytes over.

    `direct=True` (a plain, not TLS, connection): a flush of at least DIRECT_MIN_BYTES while the
    transport holds nothing unsent is offered first to a duplicate of the transport's socket
    (made on the first such flush, closed by `close_direct`) with one non-blocking sendmsg,
    which releases the GIL while the kernel copies (uvloop's writev holds it: a client's 512 KiB
    SEND frames kept its calling thread, which makes the next batch, from running for most of
    each write); whatever the kernel does not take goes to the transport as before. The bytes
    leave in the same order either way: the direct write happens only when the transport has
    nothing queued ahead of them.
    """

    __slots__ = ("_transport", "_loop", "_pending", "pending_bytes", "_held", "_after_flush", "_direct_ok",
                 "direct", "direct_bytes")

    def __init__(self, transport: object, loop: object,
                 after_flush: Callable[[], None] | None = None, direct: bool = False) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list = []
        self.pending_bytes = 0  # written here, not yet handed to the transport
        self._held = False
        self._after_flush = after_flush
        self._direct_ok = direct
        self.direct: socket.socket | None = None  # the duplicate, once a large flush made it
        self.direct_bytes = 0  # bytes the kernel took from `direct` so far

    def write(self, buffers: list) -> int:
        """Queue encoded buffers; returns their size in bytes."""
        if not self._pending and not self._held:
            self._loop.call_soon(self.flush)  # type: ignore[attr-defined]
        self._pending += buffers
        n = 0
        for b in buffers:
            n += len(b)
        self.pending_bytes += n
        return n

    @property
    def held(self) -> bool:
        """True between `hold()` and `release()`."""
        return self._held

    def hold(self) -> None:
        """Writes from now on wait for `release()` (no flush is scheduled for them)."""
        self._held = True

    def release(self) -> None:
        """Hand what was written since `hold()` to the transport now."""
        self._held = False
        if self._pending:
            self.flush()

    def unsent(self) -> int:
        """Bytes written and not yet taken by the kernel (here plus the transport's buffer)."""
        return self.pending_bytes + self._transport.get_write_buffer_size()  # type: ignore[attr-defined]

    def flush(self) -> None:
        """Hand everything written so far to the transport now (before a close)."""
        pending, self._pending = self._pending, []
        size, self.pending_bytes = self.pending_bytes, 0
        if pending and not self._transport.is_closing():  # type: ignore[attr-defined]
            if (self._direct_ok and size >= DIRECT_MIN_BYTES and len(pending) <= DIRECT_MAX_BUFFERS
                    and not self._transport.get_write_buffer_size()  # type: ignore[attr-defined]
                    and (self.direct is not None or self._open_direct())):
                try:
                    sent = self.direct.sendmsg(pending, (), socket.MSG_DONTWAIT)  # type: ignore[union-attr]
                except OSError:  # full (EAGAIN), or broken: the transport meets it its own way
                    sent = 0
                self.direct_bytes += sent
                pending = _after(pending, sent)
            if pending:
                self._transport.writelines(pending)  # type: ignore[attr-defined]
            if self._after_flush is not None:
                self._after_flush()

    def _open_direct(self) -> bool:
        """Duplicate the transport's socket for direct writes; False (and never again) if it cannot."""
        self.direct = duplicate_socket(self._transport)
        self._direct_ok = self.direct is not None
        return self._direct_ok

    def close_direct(self) -> None:
        """Close the duplicate (the connection is gone); no direct writes from now on."""
        self._direct_ok = False
        if self.direct is not None:
            self.direct.close()
            self.direct = None
