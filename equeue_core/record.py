"""The stored record: one message as it sits in a store, byte for byte.

The same layout travels on the wire (a producer's batch body is a run of records with the
store-assigned fields zeroed), sits in the commit log, and comes back in pull responses, so a
message is laid out once and copied, never re-encoded. docs/format.md is the reference for these
bytes; this module is its code. All integers are little-endian.

    off  size  field
    0    4     size          u32  total bytes of the record, this field included
    4    1     magic         u8   0xE7
    5    1     version       u8   1
    6    2     flags         u16  reserved, 0
    8    4     crc           u32  crc32c (Castagnoli) of bytes [12, size)
    12   8     position      u64  store position (commit-log byte offset for the file store)
    20   8     queue_offset  u64  offset within (topic, queue_id)
    28   4     queue_id      u32
    32   4     reconsume     u32  times this message was sent back for retry
    36   8     born_ts       i64  producer clock, ms since the epoch
    44   8     store_ts      i64  broker clock when stored, ms since the epoch
    52   8     tag_hash      u64  tag_hash(tag); 0 when there is no tag
    60   2     topic_len     u16
    62   2     tag_len       u16
    64   4     keys_len      u32
    68   4     props_len     u32
    72   4     body_len      u32
    76   ...   topic, tag, keys (UTF-8, joined by 0x1F), properties (msgpack map str->str), body

The crc is computed by the store when it stamps position, queue offset and store time, so it covers
every byte a reader will trust. A record whose size field, magic, length fields or crc disagree is
torn or corrupt and is never served.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import crc32c as _crc32c
import msgspec

from equeue_core.errors import CorruptRecordError, InvalidMessageError, MessageTooLargeError

MAGIC = 0xE7
VERSION = 1
HEADER = struct.Struct("<IBBHIQQIIqqQHHIII")
HEADER_SIZE = HEADER.size  # 76
KEY_SEPARATOR = "\x1f"

# Field offsets, for pack_into/unpack_from on a record that starts at `start`.
OFF_SIZE = 0
OFF_CRC = 8
OFF_POSITION = 12
OFF_QUEUE_OFFSET = 20
OFF_QUEUE_ID = 28
OFF_RECONSUME = 32
OFF_BORN_TS = 36
OFF_STORE_TS = 44
OFF_TAG_HASH = 52
CRC_FROM = 12

# One queue-index entry: position u64, record size u32, tag hash u64 (20 bytes). Queue offset n
# of a queue is entry n, so offset -> entry is arithmetic.
INDEX_ENTRY = struct.Struct("<QIQ")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 20

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_STAMP = struct.Struct("<QQI")  # position, queue_offset, queue_id at OFF_POSITION
_TS = struct.Struct("<q")
_LENS = struct.Struct("<HHIII")  # at offset 60
_HEAD20 = struct.Struct("<IBBHIQ")  # size, magic, version, flags, crc, position: the first 20 bytes

_props_encoder = msgspec.msgpack.Encoder()
_props_decoder = msgspec.msgpack.Decoder(dict[str, str])

crc32c = _crc32c.crc32c


def tag_hash(tag: str | None) -> int:
    """64-bit hash of a tag; 0 means "no tag". Stable across processes and versions."""
    if not tag:
        return 0
    h = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little")
    return h or 1


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def encode_record(
    topic: str,
    body: bytes,
    tag: str | None = None,
    keys: Sequence[str] = (),
    properties: dict[str, str] | None = None,
    queue_id: int = 0,
    born_ts: int | None = None,
    reconsume: int = 0,
) -> bytes:
    """Lay out one record with the store-assigned fields (crc, position, queue offset, store time) zero."""
    topic_b = topic.encode()
    tag_b = tag.encode() if tag else b""
    if any(KEY_SEPARATOR in k for k in keys):
        raise InvalidMessageError("a key may not contain the 0x1F separator")
    keys_b = KEY_SEPARATOR.join(keys).encode() if keys else b""
    props_b = _props_encoder.encode(properties) if properties else b""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidMessageError(f"body must be bytes, not {type(body).__name__}")
    size = HEADER_SIZE + len(topic_b) + len(tag_b) + len(keys_b) + len(props_b) + len(body)
    head = HEADER.pack(
        size, MAGIC, VERSION, 0, 0, 0, 0, queue_id, reconsume,
        now_ms() if born_ts is None else born_ts, 0, tag_hash(tag),
        len(topic_b), len(tag_b), len(keys_b), len(props_b), len(body),
    )
    return b"".join((head, topic_b, tag_b, keys_b, props_b, body))


def scan(buf: bytes | bytearray | memoryview, start: int = 0, end: int | None = None,
         topic: bytes | None = None, max_body: int | None = None) -> list[int]:
    """Return the start of every record in buf[start:end], checking sizes, magic and lengths.

    The crc is not checked (producer batches carry none yet); raises CorruptRecordError on a
    record that does not parse, so a malformed batch is refused whole. With `topic`, every record
    must name that topic (InvalidMessageError); with `max_body`, no body may be larger
    (MessageTooLargeError): the checks the broker makes before it stores a producer's batch.
    """
    end = len(buf) if end is None else end
    starts: list[int] = []
    pos = start
    unpack_size = _U32.unpack_from
    unpack_lens = _LENS.unpack_from
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise CorruptRecordError(f"truncated record header at {pos}")
        (size,) = unpack_size(buf, pos)
        if buf[pos + 4] != MAGIC or buf[pos + 5] != VERSION:
            raise CorruptRecordError(f"bad magic/version at {pos}")
        if size < HEADER_SIZE or pos + size > end:
            raise CorruptRecordError(f"bad record size {size} at {pos}")
        lens = unpack_lens(buf, pos + 60)
        if HEADER_SIZE + sum(lens) != size:
            raise CorruptRecordError(f"record lengths do not add up at {pos}")
        if max_body is not None and lens[4] > max_body:
            raise MessageTooLargeError(f"message body of {lens[4]} bytes is over the maximum of {max_body}",
                                       size=lens[4], max=max_body)
        if topic is not None and buf[pos + HEADER_SIZE:pos + HEADER_SIZE + lens[0]] != topic:
            raise InvalidMessageError("a record in the batch names another topic than the request")
        starts.append(pos)
        pos += size
    return starts


def stamp_batch(
    buf: bytearray,
    starts: Sequence[int],
    positions: Sequence[int],
    first_queue_offset: int,
    queue_id: int,
    store_ts: int,
) -> None:
    """Stamp position, queue offset, queue id and store time into each record, then compute its crc.

    Stores call this under their single writer, after choosing positions and queue offsets.
    """
    mv = memoryview(buf)
    pack_stamp = _STAMP.pack_into
    pack_ts = _TS.pack_into
    unpack_size = _U32.unpack_from
    pack_u32 = _U32.pack_into
    qoff = first_queue_offset
    for s, p in zip(starts, positions, strict=True):
        pack_stamp(buf, s + OFF_POSITION, p, qoff, queue_id)
        pack_ts(buf, s + OFF_STORE_TS, store_ts)
        (size,) = unpack_size(buf, s)
        pack_u32(buf, s + OFF_CRC, crc32c(mv[s + CRC_FROM:s + size]))
        qoff += 1


def index_entries(batch: bytes | bytearray | memoryview, starts: Sequence[int],
                  positions: Sequence[int]) -> bytearray:
    """Packed INDEX_ENTRY entries for a stamped batch, built in one go."""
    out = bytearray(INDEX_ENTRY_SIZE * len(starts))
    pack = INDEX_ENTRY.pack_into
    unpack_size = _U32.unpack_from
    unpack_hash = _U64.unpack_from
    o = 0
    for s, p in zip(starts, positions, strict=True):
        pack(out, o, p, unpack_size(batch, s)[0], unpack_hash(batch, s + OFF_TAG_HASH)[0])
        o += INDEX_ENTRY_SIZE
    return out


def index_runs(entries: bytes | bytearray | memoryview, max_count: int, max_bytes: int,
               tag_hashes: frozenset[int] | set[int] | None = None) -> tuple[list[tuple[int, int]], int, int]:
    """What a pull reads, from its queue's INDEX_ENTRY entries in offset order: (runs, count,
    scanned). `runs` are the [start, end) log spans of the records taken, adjacent records merged
    into one span (one log read each); `count` the records taken; `scanned` the entries passed,
    taken or filtered out (the pull's next offset is its offset + scanned). Entries whose tag hash
    is not in `tag_hashes` (when given) are passed over. Taking stops after `max_count` records,
    or before the record that would take the total past `max_bytes` (the first record is always
    taken, whatever its size)."""
    if len(entries) % INDEX_ENTRY_SIZE:
        raise ValueError(f"index entries are {INDEX_ENTRY_SIZE} bytes each, not {len(entries)} bytes in all")
    runs: list[tuple[int, int]] = []
    run_start = run_end = -1
    count = total = scanned = 0
    for pos, size, th in INDEX_ENTRY.iter_unpack(entries):
        if tag_hashes is not None and th not in tag_hashes:
            scanned += 1
            continue
        if count and total + size > max_bytes:
            break
        scanned += 1
        count += 1
        total += size
        if pos == run_end:
            run_end += size
        else:
            if run_end >= 0:
                runs.append((run_start, run_end))
            run_start, run_end = pos, pos + size
        if count >= max_count:
            break
    if run_end >= 0:
        runs.append((run_start, run_end))
    return runs, count, scanned


def verify(buf: bytes | bytearray | memoryview, start: int = 0, limit: int | None = None) -> int:
    """Return the size of the intact record at start, or raise CorruptRecordError.

    Checks that the header fits, the size is sane and fits before `limit`, magic/version, the
    length fields, and the crc: exactly the checks a reader needs before trusting a record.
    """
    limit = len(buf) if limit is None else limit
    if limit - start < HEADER_SIZE:
        raise CorruptRecordError(f"truncated header at {start}")
    (size,) = _U32.unpack_from(buf, start)
    if size < HEADER_SIZE or start + size > limit:
        raise CorruptRecordError(f"bad size {size} at {start}")
    if buf[start + 4] != MAGIC or buf[start + 5] != VERSION:
        raise CorruptRecordError(f"bad magic/version at {start}")
    if HEADER_SIZE + sum(_LENS.unpack_from(buf, start + 60)) != size:
        raise CorruptRecordError(f"record lengths do not add up at {start}")
    (crc,) = _U32.unpack_from(buf, start + OFF_CRC)
    if crc32c(memoryview(buf)[start + CRC_FROM:start + size]) != crc:
        raise CorruptRecordError(f"crc mismatch at {start}")
    return size


_python_verify = verify  # damage() asks the Python one why, whichever verify is selected below


def damage(buf: bytes | bytearray | memoryview, start: int, size: int, position: int) -> str | None:
    """Why the record an index entry names (`size` bytes at `start` of buf, stamped with
    `position`) must not be served, or None if it is intact: record.verify's checks plus "it is the
    record the entry names". The common case costs one unpack and one crc (the length fields sit
    inside the crc'd bytes, so an intact crc vouches for them). An entry of size 0 is a file-store
    marker for a record recovery could not find (docs/format.md, "lost")."""
    if size == 0:
        return "lost: recovery found no record for this offset (see the recovery report)"
    if size >= HEADER_SIZE and len(buf) - start >= size:
        whole, magic, version, _flags, crc, at = _HEAD20.unpack_from(buf, start)
        if (whole == size and magic == MAGIC and version == VERSION and at == position
                and crc32c(memoryview(buf)[start + CRC_FROM:start + size]) == crc):
            return None
    try:
        found = _python_verify(buf, start, min(len(buf), start + size))
    except CorruptRecordError as e:
        return str(e).rsplit(" at ", 1)[0]  # "crc mismatch at 0": the offset in buf says nothing here
    if found != size:
        return f"record is {found} bytes, its index entry says {size}"
    return f"record says position {_U64.unpack_from(buf, start + OFF_POSITION)[0]}, expected {position}"


def crc_spans(data: bytes | bytearray | memoryview, starts: Sequence[int], ends: Sequence[int]) -> array:
    """crc32c of data[starts[i]:ends[i]] for every i, as an array('I') of one u32 per span (usable
    as is, or as numpy.frombuffer(result, numpy.uint32)). starts/ends: sequences of ints or int
    arrays (numpy int64 included). A span outside data is a ValueError, never a silently short crc.
    The batch form of crc32c for readers that check many records at once (Spark export, KV reads)."""
    mv = memoryview(data).cast("B")
    if len(starts) != len(ends):
        raise ValueError(f"crc_spans: {len(starts)} starts but {len(ends)} ends")
    out = array(_U32_TYPECODE)
    crc = crc32c
    for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
        if not 0 <= a <= b <= len(mv):
            raise ValueError(f"crc_spans: span {i} [{a}, {b}) is outside the {len(mv)} bytes of data")
        out.append(crc(mv[a:b]))
    return out


_U32_TYPECODE = "I" if array("I").itemsize == 4 else "L"


def corrupt_record(topic: str, queue_id: int, offset: int, position: int, why: str) -> CorruptRecordError:
    """The typed error a store raises instead of serving a damaged record: it names where the
    record is (topic, queue, queue offset, store position), so an operator can skip exactly it."""
    return CorruptRecordError(f"corrupt record at {topic}/{queue_id} offset {offset} (position {position}): {why}",
                              topic=topic, queue_id=queue_id, offset=offset, position=position)


def record_size(buf: bytes | bytearray | memoryview, start: int = 0) -> int:
    return _U32.unpack_from(buf, start)[0]


@dataclass(slots=True)
class StoredMessage:
    """A decoded record, as handed to consumers and tools."""

    topic: str
    queue_id: int
    queue_offset: int
    position: int
    tag: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    body: bytes
    born_ts: int
    store_ts: int
    reconsume_times: int = 0
    tag_hash: int = 0
    msg_id: str = field(default="")


def decode(buf: bytes | bytearray | memoryview, start: int = 0) -> StoredMessage:
    """Decode the record at start into a StoredMessage (no crc check: see verify)."""
    (size, _m, _v, _f, _crc, position, qoff, qid, reconsume, born, stored, th,
     tlen, taglen, klen, plen, blen) = HEADER.unpack_from(buf, start)
    p = start + HEADER_SIZE
    mv = memoryview(buf)
    topic = str(mv[p:p + tlen], "utf-8")
    p += tlen
    tag = str(mv[p:p + taglen], "utf-8") if taglen else None
    p += taglen
    keys = tuple(str(mv[p:p + klen], "utf-8").split(KEY_SEPARATOR)) if klen else ()
    p += klen
    props = _props_decoder.decode(mv[p:p + plen]) if plen else {}
    p += plen
    body = bytes(mv[p:p + blen])
    return StoredMessage(topic, qid, qoff, position, tag, keys, props, body, born, stored,
                         reconsume, th)


def iter_records(buf: bytes | bytearray | memoryview) -> Iterator[StoredMessage]:
    """Decode every record of a run of records (e.g. a pull response body)."""
    for s in scan(buf):
        yield decode(buf, s)


def _spans_held(runs: Sequence[tuple[int, int]], page: int, held: Sequence[int]) -> bool:
    slots = len(held)
    for start, end in runs:
        for k in range(start // page, (end - 1) // page + 1):
            if held[k % slots] != k:
                return False
    return True


def gather_runs(ring: bytes | bytearray | memoryview, runs: Sequence[tuple[int, int]], page: int,
                held: Sequence[int]) -> bytes | None:
    """The log bytes of `runs` (index_runs' [start, end) position spans, in order) joined into one
    bytes, read out of a paged ring: log byte b lives at ring[b % len(ring)], and the ring is
    len(held) slots of `page` bytes, slot i holding log page held[i] (position // page; -1: none).
    None if a span is empty, negative or longer than the ring less a page, or if a slot a span
    touches does not hold that span's page, before the copy or after it (a writer lapped the ring
    meanwhile): the caller then reads the spans elsewhere. ValueError if the ring is not
    len(held) * page bytes.

    Why one call for every span of a pull: over many topics a queue's records lie in the log in
    runs of a dozen, so a pull of 750 took ~50 ring reads, each with its own checks and copy, and
    they were most of a broker's pull (docs/benchmarks.md, "Futures the collector need not count,
    a pull's spans in one copy")."""
    view = memoryview(ring)
    size = len(view)
    if page <= 0 or size != page * len(held):
        raise ValueError(f"a ring of {size} bytes is not {len(held)} slots of {page} bytes")
    for start, end in runs:
        if start < 0 or end - start <= 0 or end - start > size - page:
            return None
    if not _spans_held(runs, page, held):
        return None
    parts = []
    for start, end in runs:
        a = start % size
        n = end - start
        if a + n <= size:
            parts.append(view[a:a + n])
        else:
            parts += (view[a:], view[:n - (size - a)])
    out = b"".join(parts)
    return out if _spans_held(runs, page, held) else None


def header_fields(buf: bytes | bytearray | memoryview, start: int = 0) -> tuple:
    """The fixed header of the record at start, unpacked (see HEADER for the order)."""
    return HEADER.unpack_from(buf, start)


# ---------------------------------------------------------------- implementation selection
#
# The functions above are the specification. equeue_core._native (equeue_core/_native.c, built by
# `pip install` where a C compiler is present) has the same ones, bit-identical with the same errors;
# they replace the module's names here, so `from equeue_core.record import scan` gets the fast one.
# EQUEUE_PURE_PYTHON=1 keeps the Python ones. IMPLEMENTATION says which is in use.

HOT_PATH = ("scan", "stamp_batch", "index_entries", "index_runs", "verify", "damage", "crc_spans", "encode_record",
            "gather_runs")
PYTHON_FUNCTIONS = {name: globals()[name] for name in HOT_PATH}


def _load_native():  # -> module | None
    """equeue_core._native with the Python versions bound as its fallbacks, or None if not built."""
    try:
        from equeue_core import _native
    except ImportError:
        return None
    _native._bind(**PYTHON_FUNCTIONS, u32_array=lambda raw: array(_U32_TYPECODE, raw), tag_hash=tag_hash,
                  props_encode=_props_encoder.encode)
    return _native


native_module = _load_native()  # built (tests compare it with the Python functions even when not selected)
native = None if os.environ.get("EQUEUE_PURE_PYTHON", "") not in ("", "0") else native_module  # selected
NATIVE_FUNCTIONS = {name: getattr(native_module, name) for name in HOT_PATH} if native_module is not None else {}
IMPLEMENTATION = f"native (crc32c {native.crc32c_implementation()})" if native is not None else "python"
if native is not None:
    scan = native.scan  # noqa: F811
    stamp_batch = native.stamp_batch  # noqa: F811
    index_entries = native.index_entries  # noqa: F811
    index_runs = native.index_runs  # noqa: F811
    gather_runs = native.gather_runs  # noqa: F811
    verify = native.verify  # noqa: F811
    damage = native.damage  # noqa: F811
    crc_spans = native.crc_spans  # noqa: F811
    encode_record = native.encode_record  # noqa: F811
