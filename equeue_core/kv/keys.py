"""Key and value layouts shared by the LMDB and RocksDB stores (docs/stores.md, "On disk").

Both stores import this module (and chunks.py, queries.py and offsets.py beside it), so they lay out
bytes the same way.

Integers in keys are big-endian so byte order is numeric order (range scans and seeks work);
integers in values are little-endian like every other integer in equeue (record.py). Topic names
are `[A-Za-z0-9_.%-]`, so the 0x00 after a topic can never be part of it.

    log      position of a chunk's first record u64 BE          -> the chunk's records (chunks.py)
    index    topic, 0x00, queue_id u32 BE, chunk's first queue offset u64 BE
                                                                -> the chunk's record.INDEX_ENTRY entries
    queues   topic, 0x00, queue_id u32 BE                      -> min_offset u64 LE, next_offset u64 LE
    state    b"next_position" | b"min_position"                -> u64 LE; b"clean" -> 0x00 | 0x01
    offsets  u16 BE len, group, u16 BE len, topic, queue_id u32 BE -> next offset u64 LE
    meta     key (UTF-8): b"topics" | b"schedule_progress"     -> JSON value (equeue_core/metadata.py)
             (b"schedule_delivered": the layout before the store-engine hook, read only while
             b"schedule_progress" is missing)

A group or topic must fit its u16 length (1..65535 bytes), a queue id its u32 and an offset
0..2**63-1: equeue_core/offset_limits.py checks that before anything is packed (the broker
refuses such a COMMIT_OFFSETS with `invalid_offset`, kv/offsets.py's `commit` refuses it too), so
`offset_key` never sees one.
"""

from __future__ import annotations

import struct

POSITION = struct.Struct(">Q")
QUEUE_ID = struct.Struct(">I")
QUEUE_OFFSET = struct.Struct(">Q")
QUEUE_RANGE = struct.Struct("<QQ")
U64_VALUE = struct.Struct("<Q")
_LEN = struct.Struct(">H")

NEXT_POSITION = b"next_position"
MIN_POSITION = b"min_position"
CLEAN = b"clean"


def log_key(position: int) -> bytes:
    return POSITION.pack(position)


def position_of(key: bytes | memoryview) -> int:
    return POSITION.unpack(key)[0]


def queue_key(topic: str, queue_id: int) -> bytes:
    """The queue's key in `queues` and the prefix of its entries in `index`."""
    return topic.encode() + b"\x00" + QUEUE_ID.pack(queue_id)


def parse_queue_key(key: bytes | memoryview) -> tuple[str, int]:
    key = bytes(key)
    return key[:-5].decode(), QUEUE_ID.unpack_from(key, len(key) - 4)[0]


def index_key(prefix: bytes, queue_offset: int) -> bytes:
    return prefix + QUEUE_OFFSET.pack(queue_offset)


def offset_key_prefix(group: str) -> bytes:
    g = group.encode()
    return _LEN.pack(len(g)) + g


def offset_key(group: str, topic: str, queue_id: int) -> bytes:
    t = topic.encode()
    return offset_key_prefix(group) + _LEN.pack(len(t)) + t + QUEUE_ID.pack(queue_id)


def parse_offset_key(key: bytes | memoryview) -> tuple[str, str, int]:
    key = bytes(key)
    (glen,) = _LEN.unpack_from(key, 0)
    group = key[2:2 + glen].decode()
    p = 2 + glen
    (tlen,) = _LEN.unpack_from(key, p)
    topic = key[p + 2:p + 2 + tlen].decode()
    return group, topic, QUEUE_ID.unpack_from(key, p + 2 + tlen)[0]
