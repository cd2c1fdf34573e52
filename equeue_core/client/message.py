"""What users send and receive."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from equeue_core import record
from equeue_core.errors import InvalidMessageError


@dataclass(slots=True)
class Message:
    """A message to send. `body` is bytes (a str is sent as UTF-8).

    delay_level (1-based, see the broker's delay_levels) or deliver_at (datetime or epoch ms)
    hold the message on the broker until it is due.
    """

    topic: str
    body: bytes | str
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] | None = None
    delay_level: int | None = None
    deliver_at: _dt.datetime | int | None = None

    def encode(self, queue_id: int = 0) -> bytes:
        body = self.body.encode() if isinstance(self.body, str) else self.body
        if isinstance(self.keys, str):
            keys: Sequence[str] = (self.keys,)
        else:
            keys = tuple(self.keys)
        if self.properties is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.properties.items()):
            raise InvalidMessageError("properties must map str to str")
        return record.encode_record(self.topic, body, self.tag, keys, self.properties, queue_id)

    def deliver_at_ms(self) -> int | None:
        if self.deliver_at is None:
            return None
        if isinstance(self.deliver_at, _dt.datetime):
            d = self.deliver_at
            if d.tzinfo is None:
                d = d.astimezone()
            return int(d.timestamp() * 1000)
        return int(self.deliver_at)


@dataclass(slots=True)
class SendResult:
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    broker: str = ""  # the broker's name with nameserver= (queue ids are per broker); "" with broker=


@dataclass(slots=True)
class ReceivedMessage:
    """A consumed message. For a message from the group's retry or dead-letter topic, `topic` is the
    original topic and `reconsume_times` counts earlier failures."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    body: bytes
    born_ts: int
    store_ts: int
    reconsume_times: int = 0
    source_topic: str = field(default="")  # the topic it was pulled from (a retry topic for retries)


def received_from(buf: bytes | memoryview, start: int, id_prefix: str) -> ReceivedMessage:
    """The one record at start as a ReceivedMessage."""
    return decode_batch(memoryview(buf)[start:start + record.record_size(buf, start)], id_prefix)[0]


_SYSTEM = ("%RETRY%", "%DLQ%")


def decode_batch(buf: bytes | bytearray | memoryview, id_prefix: str) -> list[ReceivedMessage]:
    """Every record of a pull response, decoded in one pass (the consumer's hot path: one header
    unpack per message, properties and keys decoded only when present)."""
    mv = memoryview(buf)
    end = len(mv)
    unpack = record.HEADER.unpack_from
    hsize = record.HEADER_SIZE
    sep = record.KEY_SEPARATOR
    props_decode = record._props_decoder.decode
    out: list[ReceivedMessage] = []
    append = out.append
    pos = 0
    while pos < end:
        if end - pos < hsize:
            raise record.CorruptRecordError(f"truncated record header at {pos}")
        (size, _m, _v, _f, _crc, position, qoff, qid, reconsume, born, stored, _th,
         tlen, taglen, klen, plen, blen) = unpack(mv, pos)
        if size != hsize + tlen + taglen + klen + plen + blen or pos + size > end:
            raise record.CorruptRecordError(f"bad record size {size} at {pos}")
        p = pos + hsize
        topic = str(mv[p:p + tlen], "utf-8")
        p += tlen
        tag = str(mv[p:p + taglen], "utf-8") if taglen else None
        p += taglen
        keys = tuple(str(mv[p:p + klen], "utf-8").split(sep)) if klen else ()
        p += klen
        props = props_decode(mv[p:p + plen]) if plen else {}
        p += plen
        shown = props.get("RETRY_TOPIC", topic) if plen and topic.startswith(_SYSTEM) else topic
        append(ReceivedMessage(shown, qid, qoff, f"{id_prefix}{position:016X}", tag, keys, props,
                               bytes(mv[p:p + blen]), born, stored, reconsume, topic))
        pos += size
    return out


python_decode_batch = decode_batch
# The C decode_batch (equeue_core/_native.c) when record.py selected the native hot path: same
# ReceivedMessage objects, same errors; the Python one above stays its specification and fallback.
if record.native_module is not None:
    DECODE_BATCH_BUILDS = record.native_module._bind_received(
        ReceivedMessage, tuple(f.name for f in fields(ReceivedMessage)), record._props_decoder.decode)
    record.native_module._bind(decode_batch=python_decode_batch)
if record.native is not None:
    decode_batch = record.native.decode_batch  # noqa: F811
