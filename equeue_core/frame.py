"""The wire frame: one format for every transport (docs/protocol.md is the reference).

    off  size  field
    0    4     length      u32  bytes after this field (22 - 4 + header_len + body_len)
    4    1     magic       u8   0xEB
    5    1     version     u8   1
    6    2     code        u16  request code (equeue_core.codes)
    8    1     flags       u8   1 response, 2 one-way, 4 error, 8 push
    9    1     reserved    u8   0
    10   8     request_id  u64  chosen by the requester, echoed in the response
    18   4     header_len  u32
    22   ...   header      msgpack map with str keys (may be empty: header_len 0)
    ...  ...   body        opaque bytes (message batches use the record layout of record.py)

A transport only has to move whole frames: it reads the 4-byte length, refuses a length over the
maximum frame size, reads the rest, and hands the bytes to `decode`. Everything above the
transport works with Frame objects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgspec

from equeue_core.errors import FrameTooLargeError, ProtocolError

MAGIC = 0xEB
VERSION = 1
HEAD = struct.Struct("<IBBHBBQI")
HEAD_SIZE = HEAD.size  # 22
LENGTH = struct.Struct("<I")
LENGTH_SIZE = 4
DEFAULT_MAX_FRAME = 16 * 1024 * 1024

FLAG_RESPONSE = 1
FLAG_ONEWAY = 2
FLAG_ERROR = 4
FLAG_PUSH = 8

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])


class BodyParts:
    """A body that is several buffers, written out in order and never joined on the way out.

    For frames a server writes: a PULL_MULTI answer's sections are each a fresh copy out of the
    store, and joining them copied every byte a second time (docs/benchmarks.md, "A pull's
    runs out of the mapped chunks in one copy"). `encode` puts the buffers after the header as
    they are; `len()` is their bytes and `bytes()` joins them, for anything that needs one
    buffer. Each buffer must be bytes-like with one byte per item (bytes, bytearray, or a
    memoryview of format "B")."""

    __slots__ = ("buffers", "nbytes")

    def __init__(self, buffers: list[bytes | bytearray | memoryview]) -> None:
        self.buffers = buffers
        self.nbytes = sum(map(len, buffers))

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.buffers)


@dataclass(slots=True)
class Frame:
    code: int
    request_id: int = 0
    flags: int = 0
    header: dict[str, Any] = field(default_factory=dict)
    body: bytes | bytearray | memoryview | BodyParts = b""

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)

    @property
    def is_error(self) -> bool:
        return bool(self.flags & FLAG_ERROR)

    @property
    def is_push(self) -> bool:
        return bool(self.flags & FLAG_PUSH)

    def response(self, header: dict[str, Any] | None = None,
                 body: bytes | bytearray | memoryview | BodyParts = b"") -> Frame:
        """The response frame to this request."""
        return Frame(self.code, self.request_id, FLAG_RESPONSE, header or {}, body)

    def error_response(self, code: str, message: str, **details: Any) -> Frame:
        header = {"error": code, "message": message}
        if details:
            header["details"] = details
        return Frame(self.code, self.request_id, FLAG_RESPONSE | FLAG_ERROR, header, b"")


def encode(frame: Frame, max_frame: int = DEFAULT_MAX_FRAME) -> list[bytes | bytearray | memoryview]:
    """The frame as buffers to write in order (head+header, then body, uncopied)."""
    header_b = _encoder.encode(frame.header) if frame.header else b""
    return encode_parts(frame.code, frame.request_id, frame.flags, header_b, frame.body, max_frame)


def encode_header(header: dict[str, Any]) -> bytes:
    """A header map as `encode` writes it (for a caller that reuses the bytes: encode_parts)."""
    return _encoder.encode(header) if header else b""


def encode_parts(code: int, request_id: int, flags: int, header_b: bytes,
                 body: bytes | bytearray | memoryview | BodyParts, max_frame: int = DEFAULT_MAX_FRAME,
                 join_below: int = 0) -> list[bytes | bytearray | memoryview]:
    """`encode` for a header already encoded (encode_header): the buffers to write in order.
    A body shorter than `join_below` bytes is joined into the first buffer (one buffer: one
    plain send for a small frame); a longer one is its own buffer, uncopied (a BodyParts body:
    its buffers, each uncopied)."""
    length = HEAD_SIZE - LENGTH_SIZE + len(header_b) + len(body)
    if length + LENGTH_SIZE > max_frame:
        raise FrameTooLargeError(
            f"frame of {length + LENGTH_SIZE} bytes is over the maximum of {max_frame}",
            size=length + LENGTH_SIZE, max=max_frame)
    head = HEAD.pack(length, MAGIC, VERSION, code, flags, 0, request_id, len(header_b))
    if not body:
        return [head + header_b]
    if type(body) is BodyParts:
        if len(body) < join_below:
            return [b"".join((head, header_b, *body.buffers))]
        return [head + header_b, *body.buffers]
    if len(body) < join_below:
        return [b"".join((head, header_b, body))]
    return [head + header_b, body]


def encode_bytes(frame: Frame, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    return b"".join(encode(frame, max_frame))


def frame_length(prefix: bytes | bytearray | memoryview, max_frame: int = DEFAULT_MAX_FRAME) -> int:
    """Bytes that follow the 4-byte length prefix; raises on a length no frame can have."""
    try:
        (length,) = LENGTH.unpack_from(prefix, 0)
    except (struct.error, TypeError):
        raise ProtocolError("a frame length prefix is 4 bytes") from None
    if length + LENGTH_SIZE > max_frame:
        raise FrameTooLargeError(
            f"frame of {length + LENGTH_SIZE} bytes is over the maximum of {max_frame}",
            size=length + LENGTH_SIZE, max=max_frame)
    if length < HEAD_SIZE - LENGTH_SIZE:
        raise ProtocolError(f"frame length {length} is shorter than the frame head")
    return length


def decode(buf: bytes | bytearray | memoryview) -> Frame:
    """Parse one whole frame (length prefix included). Raises ProtocolError on anything malformed."""
    try:
        mv = memoryview(buf).cast("B")
    except TypeError:
        raise ProtocolError(f"a frame is bytes, not {type(buf).__name__}") from None
    if len(mv) < HEAD_SIZE:
        raise ProtocolError(f"frame of {len(mv)} bytes is shorter than the {HEAD_SIZE}-byte head")
    head = HEAD.unpack_from(mv, 0)
    length, magic, version = head[0], head[1], head[2]
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"bad frame magic/version {magic:#x}/{version}")
    if length + LENGTH_SIZE != len(mv):
        raise ProtocolError(f"frame length field {length} does not match {len(mv) - LENGTH_SIZE} bytes")
    return decode_checked(head, mv)


def decode_checked(head: tuple, buf: bytes | bytearray | memoryview) -> Frame:
    """`decode` for a frame whose head the caller has unpacked (HEAD.unpack_from) and checked:
    magic, version, and a length that matches `buf` (a transport's frame reader does all three
    to cut the stream), so it is not decoded twice. Raises ProtocolError like `decode`."""
    mv = memoryview(buf)
    header_len = head[7]
    if HEAD_SIZE + header_len > len(mv):
        raise ProtocolError(f"header length {header_len} runs past the frame")
    header: dict[str, Any] = {}
    if header_len:
        try:
            header = _decoder.decode(mv[HEAD_SIZE:HEAD_SIZE + header_len])
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError) as e:
            # Hostile headers: too deeply nested, keys that are not UTF-8, wrong types.
            raise ProtocolError(f"frame header does not decode: {type(e).__name__}: {e}") from None
    return Frame(head[3], head[6], head[4], header, mv[HEAD_SIZE + header_len:])
