"""Records -> Arrow record batches: the layout every store reader's export yields (Spark reads it).

The conversion works on a batch of records laid out in one buffer (`layout_to_arrow(data,
starts)`): the fixed header fields of every record are read with one numpy gather, and each
variable-length column (topic, tag, body, keys, properties) is built by pointing an Arrow
binary-view array at the records' bytes and letting Arrow's C++ cast gather them, so no Python
object is made per record for the columns asked for. Only the requested `columns` are built
(a count or a query that never selects `body` never copies a body), and a `RowFilter` (tags,
store time) drops rows before any other column is built.

pyarrow and numpy are imported lazily: the broker never needs them.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from equeue_core import msgid, record
from equeue_core.errors import CorruptRecordError
from equeue_core.record import CRC_FROM, HEADER_SIZE, KEY_SEPARATOR, MAGIC, VERSION

COLUMNS = ("topic", "queue_id", "queue_offset", "msg_id", "tag", "keys", "properties",
           "body", "born_ts", "store_ts")


def arrow_schema(columns: Sequence[str] | None = None) -> Any:
    """The export layout; with `columns`, only those fields in that order."""
    import pyarrow as pa

    fields = {
        "topic": pa.string(),
        "queue_id": pa.int32(),
        "queue_offset": pa.int64(),
        "msg_id": pa.string(),
        "tag": pa.string(),
        "keys": pa.list_(pa.string()),
        "properties": pa.map_(pa.string(), pa.string()),
        "body": pa.binary(),
        "born_ts": pa.timestamp("ms", tz="UTC"),
        "store_ts": pa.timestamp("ms", tz="UTC"),
    }
    return pa.schema([(c, fields[c]) for c in (COLUMNS if columns is None else check_columns(columns))])


def check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """`columns` as a tuple, or ValueError naming an unknown one (the caller's mistake)."""
    cols = tuple(columns)
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown export column(s) {unknown}; columns: {', '.join(COLUMNS)}")
    return cols


@dataclass(frozen=True)
class RowFilter:
    """Rows an export keeps, tested on the record headers before any column is built.

    All conditions hold together (AND); None means "no condition". Spark's null semantics: a
    record without a tag never matches `tag_in` values nor `tag_not_in`, only `tag_is_null`.
    Picklable (it travels to Spark executors).
    """

    tag_in: frozenset[str] | None = None        # tag is one of these
    tag_not_in: frozenset[str] | None = None    # tag is set and none of these
    tag_is_null: bool | None = None             # True: no tag; False: has a tag
    store_ts_min: int | None = None             # ms, inclusive
    store_ts_max: int | None = None             # ms, inclusive

    def is_empty(self) -> bool:
        return (self.tag_in is None and self.tag_not_in is None and self.tag_is_null is None
                and self.store_ts_min is None and self.store_ts_max is None)

    def needs_tags(self) -> bool:
        return self.tag_in is not None or self.tag_not_in is not None or self.tag_is_null is not None


MAX_BATCH_BYTES = 1 << 30  # record bytes behind one batch: Arrow binary offsets are int32

_HEADER_DTYPE = None
_HEX = b"0123456789ABCDEF"
_SIZE = struct.Struct("<I")
_INDEX_DTYPE = None


def _header_dtype() -> Any:
    """A numpy structured dtype laid out exactly like record.HEADER (76 packed bytes)."""
    global _HEADER_DTYPE
    if _HEADER_DTYPE is None:
        import numpy as np

        _HEADER_DTYPE = np.dtype([
            ("size", "<u4"), ("magic", "u1"), ("version", "u1"), ("flags", "<u2"), ("crc", "<u4"),
            ("position", "<u8"), ("queue_offset", "<u8"), ("queue_id", "<u4"), ("reconsume", "<u4"),
            ("born_ts", "<i8"), ("store_ts", "<i8"), ("tag_hash", "<u8"), ("topic_len", "<u2"),
            ("tag_len", "<u2"), ("keys_len", "<u4"), ("props_len", "<u4"), ("body_len", "<u4")])
        assert _HEADER_DTYPE.itemsize == HEADER_SIZE
    return _HEADER_DTYPE


def index_entry_dtype() -> Any:
    """numpy dtype of record.INDEX_ENTRY ("<QIQ": position, size, tag hash; 20 packed bytes)."""
    global _INDEX_DTYPE
    if _INDEX_DTYPE is None:
        import numpy as np

        _INDEX_DTYPE = np.dtype([("position", "<u8"), ("size", "<u4"), ("tag_hash", "<u8")])
        assert _INDEX_DTYPE.itemsize == 20
    return _INDEX_DTYPE


def _gather(raw: Any, at: Any, count: int, width: int) -> Any:
    """raw[at[i] : at[i] + width] for every i as a (count, width) uint8 array; bytes past the end
    of raw read as zero (callers mask what they do not own). Rows of a stride-1 window view are
    copied whole (numpy copies `width` bytes per row), about 20x faster than a (count, width)
    index array."""
    import numpy as np

    if len(raw) >= width:
        windows = np.lib.stride_tricks.sliding_window_view(raw, width)
        inside = at <= len(raw) - width
        if inside.all():
            return windows[at]
        out = np.zeros((count, width), dtype=np.uint8)
        out[inside] = windows[at[inside]]
    else:
        inside = np.zeros(count, dtype=bool)
        out = np.zeros((count, width), dtype=np.uint8)
    for i in np.flatnonzero(~inside).tolist():  # the few rows whose window runs past the end
        tail = raw[int(at[i]):int(at[i]) + width]
        out[i, :len(tail)] = tail
    return out


def first_damaged(data: bytes | memoryview, starts: Any, sizes: Any, positions: Any) -> int | None:
    """Index of the first record that must not be served, else None: vectorised form of the
    fast path of record.damage() (size field, magic, version, stamped position, crc) for records
    at `starts` of `data` that index entries say are `sizes` bytes at store `positions`.
    The caller asks record.damage() why, for the error message."""
    import numpy as np

    n = len(starts)
    if n == 0:
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    fits = (sizes >= HEADER_SIZE) & (starts + sizes <= len(raw))
    head = _gather(raw, starts, n, 20).view(np.dtype([
        ("size", "<u4"), ("magic", "u1"), ("version", "u1"), ("flags", "<u2"), ("crc", "<u4"),
        ("position", "<u8")])).reshape(n)
    ok = (fits & (head["size"] == sizes) & (head["magic"] == MAGIC) & (head["version"] == VERSION)
          & (head["position"] == np.asarray(positions, dtype=np.uint64)))
    if not ok.all():
        return int(np.argmin(ok))
    crcs = np.frombuffer(record.crc_spans(data, starts + CRC_FROM, starts + sizes), dtype=np.uint32)
    good = crcs == head["crc"]
    return None if good.all() else int(np.argmin(good))


def _view_array(raw: Any, data_buf: Any, at: Any, lengths: Any, kind: str, validity: Any = None) -> Any:
    """The byte ranges [at, at + lengths) of `raw` (whose bytes `data_buf` holds) as a string/binary
    Arrow array; Python makes no object per row.

    Ranges in buffer order that do not overlap (what every store reader hands over: records in
    offset order, fields of one kind) take the cheap path, _ordered_ranges_array; any other order
    goes through a binary-view array."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    ordered = _ordered_ranges_array(data_buf, at, lengths, kind, validity)
    if ordered is not None:
        return ordered
    return _view_cast_array(raw, data_buf, at, lengths, kind, validity)


_ODD_INDICES: dict[int, Any] = {}


def _ordered_ranges_array(data_buf: Any, at: Any, lengths: Any, kind: str, validity: Any = None) -> Any:
    """The ranges as a plain string/binary array, or None when they are not in buffer order.

    The whole buffer is described as one binary array of 2n values that alternate gap, range, gap,
    range... (its offsets are just the range bounds interleaved), and Arrow's C++ `take` of the odd
    values copies the ranges into a new contiguous array. 3-5x cheaper than building views (no
    prefix gather, no masking of short values) and than the view -> plain cast."""
    import numpy as np
    import pyarrow as pa

    n = len(at)
    if n == 0:
        return None
    bounds = np.empty(2 * n + 1, dtype=np.int64)
    bounds[0] = 0
    bounds[1::2] = at
    bounds[2::2] = at + lengths
    if bounds[-1] > data_buf.size or not (bounds[1:] >= bounds[:-1]).all():
        return None
    odd = _ODD_INDICES.get(n)
    if odd is None:
        odd = pa.array(np.arange(1, 2 * n, 2, dtype=np.int32))
        if n in (65536, 16384, 4096):  # the usual batch sizes: reused
            _ODD_INDICES[n] = odd
    whole = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(bounds.astype(np.int32)), data_buf])
    picked = whole.take(odd)
    typ = pa.string() if kind == "str" else pa.binary()
    return pa.Array.from_buffers(typ, n, [validity, *picked.buffers()[1:]])


def _view_cast_array(raw: Any, data_buf: Any, at: Any, lengths: Any, kind: str, validity: Any = None) -> Any:
    """The ranges in any order: a binary-view array (16 bytes per row: length, inline bytes or a
    4-byte prefix and the offset into `data_buf`) built with numpy, cast to the plain type (Arrow's
    C++ does the gather)."""
    import numpy as np
    import pyarrow as pa

    n = len(at)
    lengths = lengths.astype(np.int32)
    views = np.zeros((n, 16), dtype=np.uint8)
    v32 = views.view(np.int32).reshape(n, 4)
    v32[:, 0] = lengths
    if n:
        head = _gather(raw, at, n, 12)
        long = lengths > 12
        if long.all():
            views[:, 4:8] = head[:, :4]
            v32[:, 3] = at
        else:
            short = ~long
            head[short] *= (np.arange(12, dtype=np.int32) < lengths[short, None])
            views[:, 4:16] = head
            if long.any():
                v32[long, 2] = 0
                v32[long, 3] = at[long]
    typ = pa.string_view() if kind == "str" else pa.binary_view()
    arr = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(views), data_buf])
    return arr.cast(pa.string() if kind == "str" else pa.binary())


def _keys_array(raw: Any, data_buf: Any, at: Any, lengths: Any) -> Any:
    """list<string> of the keys (joined by KEY_SEPARATOR in the record); [] where there are none."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(at)
    typ = pa.list_(pa.string())
    nz = np.flatnonzero(lengths)
    counts = np.zeros(n, dtype=np.int32)
    if nz.size:
        parts = pc.split_pattern(_view_array(raw, data_buf, at[nz], lengths[nz], "str"), KEY_SEPARATOR)
        counts[nz] = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
        values = parts.flatten()
    else:
        values = pa.array([], pa.string())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=typ)


def _props_array(raw: Any, data_buf: Any, at: Any, lengths: Any) -> Any:
    """map<string,string> of the properties; empty where there are none. The msgpack maps of all
    rows that have some are decoded in one msgspec call (as one msgpack array)."""
    import numpy as np
    import pyarrow as pa

    n = len(at)
    typ = pa.map_(pa.string(), pa.string())
    nz = np.flatnonzero(lengths)
    counts = np.zeros(n, dtype=np.int32)
    keys: list = []
    items: list = []
    if nz.size:
        blob = _view_array(raw, data_buf, at[nz], lengths[nz], "bin")
        values = blob.buffers()[2]
        body = b"\xdd" + struct.pack(">I", len(nz)) + values.to_pybytes()[:int(lengths[nz].sum())]
        maps = _props_list_decoder().decode(body)
        counts[nz] = [len(m) for m in maps]
        for m in maps:
            keys.extend(m)
            items.extend(m.values())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                   pa.array(items, pa.string()), type=typ)


_PROPS_LIST = None


def _props_list_decoder() -> Any:
    global _PROPS_LIST
    if _PROPS_LIST is None:
        import msgspec

        _PROPS_LIST = msgspec.msgpack.Decoder(list[dict[str, str]])
    return _PROPS_LIST


def layout_to_arrow(data: bytes | memoryview, starts: Any, broker_address: tuple[str, int] | None,
                    columns: Sequence[str] | None = None, row_filter: RowFilter | None = None) -> Any:
    """One RecordBatch of the records at `starts` (byte offsets, any order) in `data`.

    Records must already be verified (crc, size): the length fields are trusted once they add up
    to the size (a CorruptRecordError otherwise). Only `columns` are built (default: all, in
    COLUMNS order); rows `row_filter` rejects are dropped before any column is built.
    `broker_address` (host, port) makes msg_id; it is only needed when msg_id is asked for.
    """
    import numpy as np
    import pyarrow as pa

    cols = COLUMNS if columns is None else check_columns(columns)
    schema = arrow_schema(cols)
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)
    if len(data) >= 2**31:
        raise ValueError(f"{len(data)} bytes of records in one batch; at most {MAX_BATCH_BYTES} (ask fewer rows)")
    raw = np.frombuffer(data, dtype=np.uint8)
    head = _gather(raw, starts, n, HEADER_SIZE).view(_header_dtype()).reshape(n)
    lens = [head[f].astype(np.int64) for f in ("topic_len", "tag_len", "keys_len", "props_len", "body_len")]
    if not (HEADER_SIZE + lens[0] + lens[1] + lens[2] + lens[3] + lens[4] == head["size"]).all():
        bad = int(np.argmin(HEADER_SIZE + sum(lens) == head["size"]))
        raise CorruptRecordError(f"record lengths do not add up at {int(starts[bad])}")
    data_buf = pa.py_buffer(data)

    tags = None
    if row_filter is not None and not row_filter.is_empty():
        keep = np.ones(n, dtype=bool)
        if row_filter.store_ts_min is not None:
            keep &= head["store_ts"] >= row_filter.store_ts_min
        if row_filter.store_ts_max is not None:
            keep &= head["store_ts"] <= row_filter.store_ts_max
        if row_filter.needs_tags():
            has_tag = lens[1] > 0
            if row_filter.tag_is_null is not None:
                keep &= ~has_tag if row_filter.tag_is_null else has_tag
            if row_filter.tag_in is not None or row_filter.tag_not_in is not None:
                import pyarrow.compute as pc

                tag_at = starts + HEADER_SIZE + lens[0]
                tags = _view_array(raw, data_buf, tag_at, lens[1], "str")
                keep &= has_tag
                if row_filter.tag_in is not None:
                    keep &= pc.is_in(tags, value_set=pa.array(sorted(row_filter.tag_in), pa.string())
                                     ).to_numpy(zero_copy_only=False)
                if row_filter.tag_not_in is not None:
                    keep &= ~pc.is_in(tags, value_set=pa.array(sorted(row_filter.tag_not_in), pa.string())
                                      ).to_numpy(zero_copy_only=False)
        if not keep.all():
            starts, head = starts[keep], head[keep]
            lens = [ln[keep] for ln in lens]
            if tags is not None:
                tags = tags.filter(pa.array(keep))
            n = len(starts)
            if n == 0:
                return pa.RecordBatch.from_pylist([], schema=schema)

    topic_at = starts + HEADER_SIZE
    tag_at = topic_at + lens[0]
    keys_at = tag_at + lens[1]
    props_at = keys_at + lens[2]
    body_at = props_at + lens[3]

    def build(name: str) -> Any:
        if name == "topic":
            return _view_array(raw, data_buf, topic_at, lens[0], "str")
        if name == "queue_id":
            return pa.array(head["queue_id"].astype(np.int32))
        if name == "queue_offset":
            return pa.array(head["queue_offset"].astype(np.int64))
        if name == "msg_id":
            return _msg_ids(head["position"], broker_address)
        if name == "tag":
            has_tag = lens[1] > 0
            validity = None if has_tag.all() else pa.py_buffer(np.packbits(has_tag, bitorder="little"))
            if tags is not None and validity is None:
                return tags  # built (and filtered) for the row filter already
            return _view_array(raw, data_buf, tag_at, lens[1], "str", validity)
        if name == "keys":
            return _keys_array(raw, data_buf, keys_at, lens[2])
        if name == "properties":
            return _props_array(raw, data_buf, props_at, lens[3])
        if name == "body":
            return _view_array(raw, data_buf, body_at, lens[4], "bin")
        return pa.array(head[name], pa.timestamp("ms", tz="UTC"))  # born_ts, store_ts

    return pa.RecordBatch.from_arrays([build(c) for c in cols], schema=schema)


def _msg_ids(positions: Any, broker_address: tuple[str, int] | None) -> Any:
    """28-hex-digit msg ids (broker address prefix + store position) built with numpy."""
    import numpy as np
    import pyarrow as pa

    if broker_address is None:
        raise ValueError("msg_id needs the broker address")
    n = len(positions)
    host, port = broker_address
    pos_bytes = positions.astype(">u8").view(np.uint8).reshape(n, 8)
    hexdigits = np.frombuffer(_HEX, dtype=np.uint8)
    ids = np.empty((n, 28), dtype=np.uint8)
    ids[:, :12] = np.frombuffer(msgid.encode_prefix(host, port).encode(), dtype=np.uint8)
    ids[:, 12::2] = hexdigits[pos_bytes >> 4]
    ids[:, 13::2] = hexdigits[pos_bytes & 0x0F]
    id_offsets = np.arange(0, 28 * (n + 1), 28, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(id_offsets), pa.py_buffer(ids.tobytes())])


def records_to_arrow(buffers: Iterable[tuple[bytes | memoryview, int]], broker_address: tuple[str, int] | None,
                     columns: Sequence[str] | None = None, row_filter: RowFilter | None = None) -> Any:
    """One RecordBatch from (buffer, record start) pairs; records must already be verified.

    Pairs that all point into one buffer are decoded in place; otherwise each record is sliced
    once into one joined buffer. See layout_to_arrow for `columns` and `row_filter`."""
    import numpy as np

    unpack_size = _SIZE.unpack_from
    pairs = list(buffers)
    if pairs and all(buf is pairs[0][0] for buf, _ in pairs):
        return layout_to_arrow(pairs[0][0], np.fromiter((s for _, s in pairs), dtype=np.int64, count=len(pairs)),
                               broker_address, columns, row_filter)
    parts: list = []
    last_buf: Any = None
    mv: Any = None
    for buf, s in pairs:
        if buf is not last_buf:
            last_buf, mv = buf, memoryview(buf)
        parts.append(mv[s:s + unpack_size(mv, s)[0]])
    return rows_to_arrow(parts, broker_address, columns, row_filter)


def rows_to_arrow(records: Sequence[bytes | memoryview], broker_address: tuple[str, int] | None,
                  columns: Sequence[str] | None = None, row_filter: RowFilter | None = None) -> Any:
    """One RecordBatch from whole verified records (one bytes object each, as key-value stores
    hold them): joined once, then decoded in place."""
    import numpy as np

    n = len(records)
    sizes = np.fromiter(map(len, records), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(sizes[:-1], out=starts[1:])
    return layout_to_arrow(b"".join(records), starts, broker_address, columns, row_filter)


BROKER_INFO = "broker.json"


def read_broker_info(data_dir: str) -> dict[str, Any]:
    """The broker.json the broker writes into its data dir (address, store, transport); {} if none."""
    try:
        with open(os.path.join(data_dir, BROKER_INFO)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def broker_address_of(data_dir: str) -> tuple[str, int]:
    info = read_broker_info(data_dir)
    return str(info.get("host", "0.0.0.0")), int(info.get("port", 0))
