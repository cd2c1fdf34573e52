"""Records -> Arrow record batches: the layout every store reader's export yields (Spark reads it).

pyarrow is imported lazily: the broker never needs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from equeue_core import msgid
from equeue_core.record import HEADER, HEADER_SIZE, KEY_SEPARATOR, _props_decoder

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


def records_to_arrow(buffers: Iterable[tuple[bytes | memoryview, int]], broker_address: tuple[str, int]) -> Any:
    """One RecordBatch from (buffer, record start) pairs; records must already be verified."""
    import pyarrow as pa

    host, port = broker_address
    prefix = msgid.encode_prefix(host, port)
    topic: list = []
    qid: list = []
    qoff: list = []
    mid: list = []
    tags: list = []
    keys: list = []
    props: list = []
    body: list = []
    born: list = []
    stored: list = []
    unpack = HEADER.unpack_from
    for buf, s in buffers:
        (_size, _m, _v, _f, _crc, position, o, q, _rc, b_ts, s_ts, _th,
         tlen, taglen, klen, plen, blen) = unpack(buf, s)
        mv = memoryview(buf)
        p = s + HEADER_SIZE
        topic.append(str(mv[p:p + tlen], "utf-8"))
        p += tlen
        tags.append(str(mv[p:p + taglen], "utf-8") if taglen else None)
        p += taglen
        keys.append(str(mv[p:p + klen], "utf-8").split(KEY_SEPARATOR) if klen else [])
        p += klen
        props.append(list(_props_decoder.decode(mv[p:p + plen]).items()) if plen else [])
        p += plen
        body.append(bytes(mv[p:p + blen]))
        qid.append(q)
        qoff.append(o)
        mid.append(f"{prefix}{position:016X}")
        born.append(b_ts)
        stored.append(s_ts)
    return pa.RecordBatch.from_arrays(
        [pa.array(topic, pa.string()), pa.array(qid, pa.int32()), pa.array(qoff, pa.int64()),
         pa.array(mid, pa.string()), pa.array(tags, pa.string()),
         pa.array(keys, pa.list_(pa.string())), pa.array(props, pa.map_(pa.string(), pa.string())),
         pa.array(body, pa.binary()), pa.array(born, pa.timestamp("ms", tz="UTC")),
         pa.array(stored, pa.timestamp("ms", tz="UTC"))],
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


def split_ranges(start: int, end: int, slice_size: int) -> Sequence[tuple[int, int]]:
    """[start, end) cut into slices of at most slice_size offsets (one Spark partition each)."""
    return [(s, min(s + slice_size, end)) for s in range(start, end, max(1, slice_size))] or []
