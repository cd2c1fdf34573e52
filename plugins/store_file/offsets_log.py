"""The offsets log: the offsets committed since the offsets file's snapshot, one record a persist.

<data_dir>/offsets.<generation>.log (docs/format.md, "Offsets file"), appended and fdatasync'ed
by FileOffsetStore.persist, a record of the offsets that changed since the persist before:

  record  := length u32 | crc32c(payload) u32 | payload      (little-endian)
  payload := msgpack array of [group, topic, queue_id, next_offset]   (next_offset -1: deleted)

The snapshot (offsets.json) names the generation of the log that continues it; a log of any other
generation is stale. Reading stops at the first record that is short or whose crc does not match:
records are appended whole and fsynced one at a time, so that can only be a torn last append.

Why a log: a persist that rewrote every committed offset cost the broker's process ~20 ms of
CPU under the GIL with 100k of them, every `offset_persist_ms`, however few had moved
(docs/benchmarks.md, "Offsets persist: what changed, not everything").
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

import msgspec

from equeue_core.record import crc32c

RECORD_HEADER = struct.Struct("<II")  # payload length, crc32c of the payload
DELETED = -1  # the next_offset of a key delete_group removed

_decode = msgspec.msgpack.Decoder(list[tuple[str, str, int, int]]).decode
_encode = msgspec.msgpack.Encoder().encode


def log_path(data_dir: str, generation: int) -> str:
    return os.path.join(data_dir, f"offsets.{generation}.log")


def is_log_name(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 3 and parts[0] == "offsets" and parts[1].isdigit() and parts[2] == "log"


def encode_record(changes: Iterable[tuple[tuple[str, str, int], int]]) -> bytes:
    """One record of (group, topic, queue_id) -> next_offset changes (DELETED for a removed key)."""
    payload = _encode([(g, t, q, o) for (g, t, q), o in changes])
    return RECORD_HEADER.pack(len(payload), crc32c(payload)) + payload


def read_records(data: bytes) -> tuple[list[tuple[str, str, int, int]], int]:
    """Every entry of the whole records at the start of `data`, in order, and where they end (a
    torn last append begins there)."""
    entries: list[tuple[str, str, int, int]] = []
    pos = 0
    view = memoryview(data)
    while pos + RECORD_HEADER.size <= len(data):
        length, crc = RECORD_HEADER.unpack_from(data, pos)
        start = pos + RECORD_HEADER.size
        payload = view[start:start + length]
        if len(payload) != length or crc32c(payload) != crc:
            break
        try:
            entries += _decode(payload)
        except msgspec.DecodeError:
            break
        pos = start + length
    return entries, pos


def apply(offsets: dict[tuple[str, str, int], int], entries: Iterable[tuple[str, str, int, int]]) -> None:
    for g, t, q, o in entries:
        if o == DELETED:
            offsets.pop((g, t, q), None)
        else:
            offsets[(g, t, q)] = o
