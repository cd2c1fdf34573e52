"""Request signing (docs/protocol.md, "Signed requests"): HMAC-SHA256 over a canonical form.

The client puts one extra header field, `auth`, into every request it sends:
`{"ak": access key, "ts": unix ms, "nonce": 16 random bytes, "sig": 32-byte HMAC}`. The
signature covers the request code, the timestamp, the nonce, the access key, a SHA-256 digest of
the body and the rest of the header (re-encoded canonically, so field order does not matter).
The same functions build the canonical bytes on both sides; an authorizer plugin recomputes the
HMAC with the account's secret and compares in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from typing import Any

import msgspec

AUTH_FIELD = "auth"
SIGNATURE_TAG = b"EQ-HMAC-SHA256-1\n"
NONCE_SIZE = 16
_FIXED = struct.Struct("<HQ")
_sorted = msgspec.msgpack.Encoder(order="sorted")


def canonical(code: int, header: dict[str, Any], body: bytes | bytearray | memoryview,
              access_key: str, ts_ms: int, nonce: bytes) -> bytes:
    """The bytes the HMAC covers (byte by byte in docs/protocol.md):
    tag | u16 code | u64 ts_ms | nonce(16) | u8 len(ak) | ak | sha256(body)(32) | sorted msgpack of
    the header without `auth`."""
    rest = {k: v for k, v in header.items() if k != AUTH_FIELD}
    ak = access_key.encode()
    return b"".join((SIGNATURE_TAG, _FIXED.pack(code & 0xFFFF, ts_ms & 0xFFFFFFFFFFFFFFFF), nonce,
                     bytes((len(ak) & 0xFF,)), ak, hashlib.sha256(body).digest(),
                     _sorted.encode(rest) if rest else b""))


def signature(secret: bytes, code: int, header: dict[str, Any], body: bytes | bytearray | memoryview,
              access_key: str, ts_ms: int, nonce: bytes) -> bytes:
    return hmac.new(secret, canonical(code, header, body, access_key, ts_ms, nonce), hashlib.sha256).digest()


def sign(code: int, header: dict[str, Any], body: bytes | bytearray | memoryview,
         access_key: str, secret: bytes) -> dict[str, Any]:
    """A copy of header with an `auth` field signing this request (fresh timestamp and nonce)."""
    ts = int(time.time() * 1000)
    nonce = os.urandom(NONCE_SIZE)
    signed = dict(header)
    signed.pop(AUTH_FIELD, None)
    signed[AUTH_FIELD] = {"ak": access_key, "ts": ts, "nonce": nonce,
                          "sig": signature(secret, code, signed, body, access_key, ts, nonce)}
    return signed


def verify(secret: bytes, code: int, header: dict[str, Any], body: bytes | bytearray | memoryview,
           access_key: str, ts_ms: int, nonce: bytes, sig: bytes) -> bool:
    return hmac.compare_digest(signature(secret, code, header, body, access_key, ts_ms, nonce), sig)
