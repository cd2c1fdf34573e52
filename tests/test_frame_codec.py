"""Property tests of the wire frame codec (equeue_core.frame) against hostile input.

The contract (frame.py's docstring, docs/protocol.md): encode/decode round-trip every frame; a
transport hands `frame_length` the 4-byte prefix and `decode` one whole frame; anything malformed
raises ProtocolError (FrameTooLargeError for a length over the maximum), never another exception
and never a hang.

Hostile headers that once escaped the kernel's decode as other exceptions (deep nesting,
non-UTF-8 keys, a short length prefix) are pinned by tests of their own below. The transports map
decode failures to ProtocolError as well, which the transport half of this file checks.
"""

from __future__ import annotations

import struct

import msgspec
import pytest
from equeue_plugins.transport_tcp.framing import decode as tcp_decode
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from equeue_core import frame as wire
from equeue_core.errors import FrameTooLargeError, ProtocolError

# What the kernel's decode may raise besides ProtocolError: nothing.
KERNEL_GAPS: tuple[type[BaseException], ...] = ()

SETTINGS = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ strategies

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False) | st.text(max_size=40) | st.binary(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=5), max_leaves=20)
headers = st.dictionaries(st.text(max_size=20), values, max_size=8)
bodies = st.binary(max_size=4096)

frames = st.builds(wire.Frame, code=u16, request_id=u64, flags=u8, header=headers, body=bodies)


def raw_frame(length: int | None = None, magic: int = wire.MAGIC, version: int = wire.VERSION,
              code: int = 1, flags: int = 0, request_id: int = 1, header: bytes = b"",
              header_len: int | None = None, body: bytes = b"") -> bytes:
    """A frame built byte by byte, with any field free to be wrong."""
    if header_len is None:
        header_len = len(header)
    if length is None:
        length = wire.HEAD_SIZE - wire.LENGTH_SIZE + len(header) + len(body)
    return wire.HEAD.pack(length, magic, version, code, flags, 0, request_id, header_len) + header + body


def decode_or_protocol_error(data: bytes, decoder=wire.decode, allowed: tuple = ()) -> wire.Frame | None:
    """decode(data); None when it raised ProtocolError (or one of `allowed`). Anything else fails."""
    try:
        return decoder(data)
    except ProtocolError:
        return None
    except allowed:
        return None


# ------------------------------------------------------------------ round trip


@SETTINGS
@given(frames)
def test_encode_decode_round_trip(frame: wire.Frame) -> None:
    data = wire.encode_bytes(frame)
    assert wire.frame_length(data[:4]) == len(data) - wire.LENGTH_SIZE
    back = wire.decode(data)
    assert (back.code, back.request_id, back.flags) == (frame.code, frame.request_id, frame.flags)
    assert back.header == frame.header
    assert bytes(back.body) == bytes(frame.body)


@SETTINGS
@given(frames)
def test_encode_buffers_are_the_frame_and_the_body_is_not_copied(frame: wire.Frame) -> None:
    frame.body = bytearray(frame.body)
    buffers = wire.encode(frame)
    assert b"".join(buffers) == wire.encode_bytes(frame)
    if frame.body:
        assert buffers[-1] is frame.body


@SETTINGS
@given(frames, st.lists(st.binary(max_size=300), max_size=6), st.integers(0, 2000))
def test_a_body_in_parts_is_the_same_frame_with_each_part_written_uncopied(
        frame: wire.Frame, parts: list[bytes], join_below: int) -> None:
    """A BodyParts body encodes to the bytes of the same frame with the parts joined; above
    `join_below` each part is its own buffer (the very object), below it one buffer in all."""
    whole = wire.Frame(frame.code, frame.request_id, frame.flags, frame.header, b"".join(parts))
    frame.body = wire.BodyParts([bytearray(p) for p in parts])
    assert len(frame.body) == sum(map(len, parts)) and bytes(frame.body) == b"".join(parts)
    assert wire.encode_bytes(frame) == wire.encode_bytes(whole)
    header_b = wire.encode_header(frame.header)
    buffers = wire.encode_parts(frame.code, frame.request_id, frame.flags, header_b, frame.body,
                                join_below=join_below)
    assert b"".join(buffers) == wire.encode_bytes(whole)
    if len(frame.body) and len(frame.body) >= join_below:
        assert all(a is b for a, b in zip(buffers[1:], frame.body.buffers, strict=True))
    else:
        assert len(buffers) == 1
    assert wire.decode(b"".join(buffers)).body == b"".join(parts)


@SETTINGS
@given(headers, st.integers(1, 64))
def test_encode_over_the_max_raises_frame_too_large(header: dict, over: int) -> None:
    limit = 4096
    head_and_header = len(wire.encode_bytes(wire.Frame(1, header=header)))
    body = b"x" * max(0, limit - head_and_header + over)
    if head_and_header + len(body) <= limit:
        body += b"x" * over
    with pytest.raises(FrameTooLargeError):
        wire.encode(wire.Frame(1, header=header, body=body), limit)


# ------------------------------------------------------------------ frame_length


@SETTINGS
@given(u32, st.integers(wire.HEAD_SIZE, 64 * 1024 * 1024))
def test_frame_length_accepts_only_lengths_a_frame_can_have(length: int, max_frame: int) -> None:
    prefix = struct.pack("<I", length)
    if length + 4 > max_frame:
        with pytest.raises(FrameTooLargeError):
            wire.frame_length(prefix, max_frame)
    elif length < wire.HEAD_SIZE - 4:
        with pytest.raises(ProtocolError):
            wire.frame_length(prefix, max_frame)
    else:
        assert wire.frame_length(prefix, max_frame) == length


@SETTINGS
@given(st.binary(min_size=4, max_size=64))
def test_frame_length_on_any_prefix_is_a_length_or_protocol_error(prefix: bytes) -> None:
    try:
        n = wire.frame_length(prefix)
    except ProtocolError:
        return
    assert wire.HEAD_SIZE - 4 <= n <= wire.DEFAULT_MAX_FRAME - 4


def test_frame_length_on_a_short_prefix_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        wire.frame_length(b"\x01\x02")


# ------------------------------------------------------------------ decode: hostile input


@SETTINGS
@given(st.binary(max_size=512))
@example(b"")
@example(b"\xeb" * 22)
def test_decode_random_bytes_is_a_frame_or_protocol_error(data: bytes) -> None:
    decode_or_protocol_error(data, allowed=KERNEL_GAPS)
    decode_or_protocol_error(data, tcp_decode)


@SETTINGS
@given(frames, st.data())
def test_decode_truncated_frame_is_protocol_error(frame: wire.Frame, data: st.DataObject) -> None:
    encoded = wire.encode_bytes(frame)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ProtocolError):
        wire.decode(encoded[:cut])


@SETTINGS
@given(frames, st.binary(min_size=1, max_size=64))
def test_decode_frame_with_trailing_bytes_is_protocol_error(frame: wire.Frame, extra: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode(wire.encode_bytes(frame) + extra)


@SETTINGS
@given(frames, st.data())
def test_decode_frame_with_a_flipped_byte_is_a_frame_or_protocol_error(frame: wire.Frame,
                                                                      data: st.DataObject) -> None:
    encoded = bytearray(wire.encode_bytes(frame))
    i = data.draw(st.integers(0, len(encoded) - 1))
    encoded[i] ^= data.draw(st.integers(1, 255))
    decode_or_protocol_error(bytes(encoded), allowed=KERNEL_GAPS)
    decode_or_protocol_error(bytes(encoded), tcp_decode)


@SETTINGS
@given(u8.filter(lambda m: m != wire.MAGIC), u8)
def test_decode_bad_magic_or_version_is_protocol_error(magic: int, version: int) -> None:
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(magic=magic))
    assume(version != wire.VERSION)
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(version=version))


@SETTINGS
@given(u32, st.binary(max_size=64))
def test_decode_length_field_that_lies_is_protocol_error(length: int, body: bytes) -> None:
    honest = wire.HEAD_SIZE - 4 + len(body)
    assume(length != honest)
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(length=length, body=body))


@SETTINGS
@given(u32, st.binary(max_size=64))
def test_decode_header_length_past_the_frame_is_protocol_error(header_len: int, body: bytes) -> None:
    assume(header_len > len(body))
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(header_len=header_len, body=body))


wrong_typed_headers = st.one_of(
    st.lists(values, max_size=4), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
    st.binary(max_size=20), st.booleans(), st.none(), st.floats(allow_nan=False),
    st.dictionaries(st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=4), values, min_size=1, max_size=4),
)


@SETTINGS
@given(wrong_typed_headers)
def test_decode_header_that_is_not_a_map_of_str_is_protocol_error(header: object) -> None:
    packed = msgspec.msgpack.encode(header)
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(header=packed))


@SETTINGS
@given(st.binary(min_size=1, max_size=128))
def test_decode_header_of_random_bytes_is_a_frame_or_protocol_error(header: bytes) -> None:
    data = raw_frame(header=header, body=b"body")
    decoded = decode_or_protocol_error(data, allowed=KERNEL_GAPS)
    if decoded is not None:
        assert isinstance(decoded.header, dict) and all(isinstance(k, str) for k in decoded.header)
    decode_or_protocol_error(data, tcp_decode)


@pytest.mark.parametrize("header", [
    b"\x81\xa1a\xdb\xff\xff\xff\xf0",  # a str claiming 4 GiB
    b"\x81\xa1a\xdd\xff\xff\xff\xf0",  # an array claiming 4 billion items
    b"\x81\xa1a\xd7\xff" + b"\xff" * 8,  # a timestamp out of range
    b"\xc1",  # the never-used msgpack byte
])
def test_decode_header_that_claims_more_than_it_has_is_protocol_error(header: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(header=header))


NESTED = b"\x81\xa1a" + b"\x91" * 200_000 + b"\xc0"
BAD_UTF8_KEY = b"\x81\xa2\xff\xfe\xc0"


def test_decode_deeply_nested_header_is_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(header=NESTED))


def test_decode_header_key_not_utf8_is_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        wire.decode(raw_frame(header=BAD_UTF8_KEY))


@pytest.mark.parametrize("header", [NESTED, BAD_UTF8_KEY])
def test_transport_decode_maps_kernel_gaps_to_protocol_error(header: bytes) -> None:
    with pytest.raises(ProtocolError):
        tcp_decode(raw_frame(header=header))


def test_decode_is_quick_on_a_max_size_frame() -> None:
    """No quadratic path: a 16 MiB frame decodes without copying the body."""
    body = bytearray(wire.DEFAULT_MAX_FRAME - wire.HEAD_SIZE)
    data = bytearray(raw_frame()[:wire.HEAD_SIZE])
    struct.pack_into("<I", data, 0, wire.DEFAULT_MAX_FRAME - 4)
    data += body
    frame = wire.decode(data)
    assert isinstance(frame.body, memoryview) and frame.body.obj is data


@pytest.mark.parametrize("junk", [None, 42, "a string", 3.5])
def test_non_buffer_input_is_a_protocol_error(junk) -> None:
    with pytest.raises(ProtocolError):
        wire.decode(junk)
    with pytest.raises(ProtocolError):
        wire.frame_length(junk)
