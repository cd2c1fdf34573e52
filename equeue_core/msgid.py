"""Message ids: broker address + store position, so a message can be fetched from its id alone.

Layout (28 uppercase hex digits): IPv4 address (4 bytes), port (2 bytes), position (8 bytes),
big-endian, the shape RocketMQ uses. A host name that is not an IPv4 literal is encoded as
0.0.0.0 and the id then only works against the broker that is asked.
"""

from __future__ import annotations

import socket
import struct

from equeue_core.errors import MessageNotFoundError

_ID = struct.Struct(">4sHQ")


def encode(host: str, port: int, position: int) -> str:
    try:
        ip = socket.inet_aton(host)
    except OSError:
        ip = b"\0\0\0\0"
    return _ID.pack(ip, port, position).hex().upper()


def encode_prefix(host: str, port: int) -> str:
    """The first 12 hex digits shared by every id of one broker (ids = prefix + position hex)."""
    return encode(host, port, 0)[:12]


def decode(msg_id: str) -> tuple[str, int, int]:
    """(host, port, position) of an id; MessageNotFoundError if it is not one of ours."""
    try:
        raw = bytes.fromhex(msg_id)
        ip, port, position = _ID.unpack(raw)
    except (ValueError, struct.error):
        raise MessageNotFoundError(f"{msg_id!r} is not a message id") from None
    return socket.inet_ntoa(ip), port, position
