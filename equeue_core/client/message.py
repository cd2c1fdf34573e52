"""What users send and receive."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from time import time_ns as _time_ns

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
        """The whole record (record.encode_record), for the rare fields too (keys, properties)."""
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


_MAX_CACHED = 4096  # distinct topics/tags whose encoded bytes are kept (then the caches start over)
_topic_bytes: dict[str, bytes] = {}
_tag_fields: dict[str, tuple[bytes, int]] = {}
_pack = record.HEADER.pack
_HEADER_SIZE, _MAGIC, _VERSION = record.HEADER_SIZE, record.MAGIC, record.VERSION


def append_records(out: list, messages: Iterable[Message], queue_id: int) -> int:
    """Append each message's record (the layout of record.encode_record, store fields zero) to
    `out` as separate buffers -- head, topic, tag, body -- and return the bytes appended.

    Why not `Message.encode` per message: the producer joins a batch's buffers once into the frame
    body, so a body is copied once here instead of twice (into its record, then into the batch),
    and the per-message work is one struct pack: topic bytes and tag hashes are cached, and the
    clock is read once per call (every record of the call gets the same born_ts). A message with
    keys or properties, or a body that is not bytes, takes `Message.encode` (same bytes, checks
    and errors). tests/test_producer_encoding.py holds the two to the same output."""
    born = _time_ns() // 1_000_000  # record.now_ms, inlined: it is read once per message on send_async
    total = 0
    for m in messages:
        total += append_record(out, m, queue_id, born)
    return total


def append_record(out: list, m: Message, queue_id: int, born: int | None = None) -> int:
    """One message of `append_records`, with born_ts `born` (ms since the epoch; None: now)."""
    if born is None:
        born = _time_ns() // 1_000_000
    body = m.body
    if m.keys or m.properties or type(body) is not bytes:
        rec = m.encode(queue_id)
        out.append(rec)
        return len(rec)
    topic_b = _topic_bytes.get(m.topic)
    if topic_b is None:
        if len(_topic_bytes) >= _MAX_CACHED:
            _topic_bytes.clear()
        topic_b = _topic_bytes[m.topic] = m.topic.encode()
    tag = m.tag
    if tag:
        fields = _tag_fields.get(tag)
        if fields is None:
            if len(_tag_fields) >= _MAX_CACHED:
                _tag_fields.clear()
            fields = _tag_fields[tag] = (tag.encode(), record.tag_hash(tag))
        tag_b, th = fields
        size = _HEADER_SIZE + len(topic_b) + len(tag_b) + len(body)
        out += (_pack(size, _MAGIC, _VERSION, 0, 0, 0, 0, queue_id, 0, born, 0, th,
                      len(topic_b), len(tag_b), 0, 0, len(body)), topic_b, tag_b, body)
        return size
    size = _HEADER_SIZE + len(topic_b) + len(body)
    out += (_pack(size, _MAGIC, _VERSION, 0, 0, 0, 0, queue_id, 0, born, 0, 0,
                  len(topic_b), 0, 0, 0, len(body)), topic_b, body)
    return size


python_append_record = append_record


def _native_append_record(out: list, m: Message, queue_id: int, born: int | None = None) -> int:
    """`append_record` with the compiled record.encode_record (one call lays the whole record out,
    the clock read in C when `born` is None): a third of the Python version's time per message,
    the producer's send_async hot path. The same bytes (tests/test_producer_encoding.py)."""
    body = m.body
    if m.keys or m.properties or type(body) is not bytes:
        rec = m.encode(queue_id)
    else:
        rec = _native_encode(m.topic, body, m.tag, (), None, queue_id, born)
    out.append(rec)
    return len(rec)


if record.native is not None:
    _native_encode = record.native.encode_record
    append_record = _native_append_record  # noqa: F811


def msg_ids(id_prefix: str, positions: Sequence[int]) -> list[str]:
    """The msg id of each stored position of a SEND answer: the broker's id prefix and the
    position as 16 upper-case hex digits (the ids decode_batch gives the consumer)."""
    return [f"{id_prefix}{p:016X}" for p in positions]


python_msg_ids = msg_ids
if record.native_module is not None:
    record.native_module._bind(msg_ids=python_msg_ids)
if record.native is not None:
    msg_ids = record.native.msg_ids  # noqa: F811


@dataclass(slots=True, frozen=True)
class SendResult:
    """Where the broker stored a sent message. Frozen, and only strs and ints: it can be in no
    reference cycle, so the compiled path makes a batch's results untracked by the cyclic GC
    (_native.c send_results)."""

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
