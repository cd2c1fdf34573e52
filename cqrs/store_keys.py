"""Key and value layout shared by the built-in event store plugins (LMDB, RocksDB).

Tables (LMDB databases / RocksDB column families):
- events:    aggregate id UTF-8, 0x00, version u64 big-endian -> msgpack [command_id, event_id, type,
             payload, timestamp_ms]. Big-endian versions make a prefix scan return version order.
- commands:  command id UTF-8 -> msgpack [aggregate_id, first_version, last_version, result]
- snapshots: aggregate id UTF-8 -> msgpack [version, state]
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import msgspec
from equeue_cqrs.store import CommandRecord, Snapshot, StoredEvent, check_id

_VERSION = struct.Struct(">Q")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


_pack_version = _VERSION.pack
# aggregate id -> its checked key prefix: a batch writes the events of the same few aggregates
# again and again, and the check plus the encode cost more than the dict lookup. Bounded: cleared
# when full (the ids come back on their next write).
_prefixes: dict[str, bytes] = {}
_MAX_PREFIXES = 100_000


def event_prefix(aggregate_id: str) -> bytes:
    prefix = _prefixes.get(aggregate_id)
    if prefix is None:
        prefix = check_id("aggregate id", aggregate_id) + b"\x00"
        if len(_prefixes) >= _MAX_PREFIXES:
            _prefixes.clear()
        _prefixes[aggregate_id] = prefix
    return prefix


def event_key(aggregate_id: str, version: int) -> bytes:
    prefix = _prefixes.get(aggregate_id)
    return (prefix or event_prefix(aggregate_id)) + _pack_version(version)


def split_event_key(key: bytes) -> tuple[str, int]:
    return key[:-9].decode(), _VERSION.unpack_from(key, len(key) - 8)[0]


def event_value(e: StoredEvent) -> bytes:
    return _encode((e.command_id, e.event_id, e.type, e.payload, e.timestamp_ms))


def event_from(key: bytes, value: bytes) -> StoredEvent:
    aggregate_id, version = split_event_key(bytes(key))
    command_id, event_id, type_, payload, ts = _decode(value)
    return StoredEvent(aggregate_id, version, command_id, event_id, type_, payload, ts)


def events_of(prefix: bytes, pairs: Iterable[tuple[bytes, bytes]], to_version: int | None) -> list[StoredEvent]:
    """The events among `pairs` (an engine's key order, from an aggregate's first wanted key)
    that still carry `prefix`, up to to_version: the one scan both event stores share."""
    out: list[StoredEvent] = []
    for k, v in pairs:
        if not k.startswith(prefix):
            break
        e = event_from(k, v)
        if to_version is not None and e.version > to_version:
            break
        out.append(e)
    return out


def command_key(command_id: str) -> bytes:
    return check_id("command id", command_id)


def command_value(c: CommandRecord) -> bytes:
    return _encode((c.aggregate_id, c.first_version, c.last_version, c.result))


def command_from(command_id: str, value: bytes) -> CommandRecord:
    aggregate_id, first, last, result = _decode(value)
    return CommandRecord(command_id, aggregate_id, first, last, result)


def snapshot_value(s: Snapshot) -> bytes:
    return _encode((s.version, s.state))


def snapshot_from(aggregate_id: str, value: bytes) -> Snapshot:
    version, state = _decode(value)
    return Snapshot(aggregate_id, version, state)
