"""Records -> Arrow record batches: the layout every store reader's export yields (Spark reads it).

pyarrow is imported lazily: the broker never needs it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from typing import Any

from equeue_core import msgid
from equeue_core.record import HEADER_SIZE, KEY_SEPARATOR, _props_decoder

COLUMNS = ("topic", "queue_id", "queue_offset", "msg_id", "tag", "keys", "properties",
           "body", "born_ts", "store_ts")


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("msg_id", pa.string()),
        ("tag", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
        ("born_ts", pa.timestamp("ms", tz="UTC")),
        ("store_ts", pa.timestamp("ms", tz="UTC")),
    ])


_HEADER_DTYPE = None
_HEX = b"0123456789ABCDEF"
_SIZE = struct.Struct("<I")


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


def records_to_arrow(buffers: Iterable[tuple[bytes | memoryview, int]], broker_address: tuple[str, int]) -> Any:
    """One RecordBatch from (buffer, record start) pairs; records must already be verified.

    Python touches each record a few times (one slice to gather it, one slice per variable
    field); the fixed fields, offsets, validity and msg ids are computed with numpy over the whole
    batch instead of a Python object per field per row.
    """
    import numpy as np
    import pyarrow as pa

    unpack_size = _SIZE.unpack_from
    parts: list = []
    append = parts.append
    last_buf: Any = None
    mv: Any = None
    for buf, s in buffers:
        if buf is not last_buf:
            last_buf, mv = buf, memoryview(buf)
        append(mv[s:s + unpack_size(mv, s)[0]])
    n = len(parts)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=arrow_schema())
    data = b"".join(parts)
    raw = np.frombuffer(data, dtype=np.uint8)
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    head = raw[starts[:, None] + np.arange(HEADER_SIZE)].view(_header_dtype()).reshape(n)

    topic_at = starts + HEADER_SIZE
    tag_at = topic_at + head["topic_len"]
    keys_at = tag_at + head["tag_len"]
    props_at = keys_at + head["keys_len"]
    body_at = props_at + head["props_len"]

    def var_array(at: Any, lengths: Any, kind: str, validity: Any = None) -> Any:
        lengths = lengths.astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ends = at + lengths
        values = b"".join(map(data.__getitem__, map(slice, at.tolist(), ends.tolist())))
        large = offsets[-1] >= 2**31
        typ = {("str", False): pa.string(), ("str", True): pa.large_string(),
               ("bin", False): pa.binary(), ("bin", True): pa.large_binary()}[(kind, bool(large))]
        arr = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)),
                                             pa.py_buffer(values)])
        return arr.cast(pa.string() if kind == "str" else pa.binary()) if large else arr

    topic = var_array(topic_at, head["topic_len"], "str")
    has_tag = head["tag_len"] > 0
    tags = var_array(tag_at, head["tag_len"], "str",
                     None if has_tag.all() else pa.py_buffer(np.packbits(has_tag, bitorder="little")))
    body = var_array(body_at, head["body_len"], "bin")

    key_lists: list = [[]] * n
    for i in np.flatnonzero(head["keys_len"]).tolist():
        a = int(keys_at[i])
        key_lists[i] = data[a:a + int(head["keys_len"][i])].decode().split(KEY_SEPARATOR)
    prop_lists: list = [[]] * n
    for i in np.flatnonzero(head["props_len"]).tolist():
        a = int(props_at[i])
        prop_lists[i] = list(_props_decoder.decode(data[a:a + int(head["props_len"][i])]).items())

    host, port = broker_address
    pos_bytes = head["position"].astype(">u8").view(np.uint8).reshape(n, 8)
    hexdigits = np.frombuffer(_HEX, dtype=np.uint8)
    ids = np.empty((n, 28), dtype=np.uint8)
    ids[:, :12] = np.frombuffer(msgid.encode_prefix(host, port).encode(), dtype=np.uint8)
    ids[:, 12::2] = hexdigits[pos_bytes >> 4]
    ids[:, 13::2] = hexdigits[pos_bytes & 0x0F]
    id_offsets = np.arange(0, 28 * (n + 1), 28, dtype=np.int32)
    msg_ids = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(id_offsets), pa.py_buffer(ids.tobytes())])
    return pa.RecordBatch.from_arrays(
        [topic, pa.array(head["queue_id"].astype(np.int32)), pa.array(head["queue_offset"].astype(np.int64)),
         msg_ids, tags, pa.array(key_lists, pa.list_(pa.string())),
         pa.array(prop_lists, pa.map_(pa.string(), pa.string())), body,
         pa.array(head["born_ts"], pa.timestamp("ms", tz="UTC")),
         pa.array(head["store_ts"], pa.timestamp("ms", tz="UTC"))],
        schema=arrow_schema())


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
