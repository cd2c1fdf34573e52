"""Export through the store reader: Arrow rows exactly as stored (what Spark reads)."""

from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
import pytest

from equeue_core import msgid
from equeue_core.export import BROKER_INFO, arrow_schema

from .kit import BORN_BASE, append, body_for, keys_for, props_for, read_all, tag_for

T = "orders"


def _write_broker_info(data_dir: str) -> None:
    with open(os.path.join(data_dir, BROKER_INFO), "w") as f:
        json.dump({"host": "127.0.0.1", "port": 9876}, f)


def test_export_yields_exact_rows_for_an_offset_range(harness):
    _write_broker_info(harness.data_dir)
    h = harness.open()
    res = [append(h, T, 1, 10), append(h, "other", 0, 5), append(h, T, 1, 10)]
    positions = res[0].positions + res[2].positions
    h.store.flush()
    stored = read_all(h.store, T, 1, 0, 20)
    reader = harness.reader()
    batches = list(reader.export(T, 1, 3, 17, batch_rows=5))
    assert all(isinstance(b, pa.RecordBatch) and b.schema == arrow_schema() for b in batches)
    assert all(0 < b.num_rows <= 5 for b in batches), "batch_rows bounds every batch"
    rows = pa.Table.from_batches(batches).to_pylist()
    assert [r["queue_offset"] for r in rows] == list(range(3, 17))
    utc = dt.UTC
    for r in rows:
        o = r["queue_offset"]
        assert r["topic"] == T and r["queue_id"] == 1
        assert r["msg_id"] == msgid.encode("127.0.0.1", 9876, positions[o])
        assert r["tag"] == tag_for(o)
        assert tuple(r["keys"]) == keys_for(o)
        assert dict(r["properties"]) == props_for(o)
        assert r["body"] == body_for(T, 1, o)
        assert r["born_ts"] == dt.datetime.fromtimestamp((BORN_BASE + o) / 1000, utc)
        assert r["store_ts"] == dt.datetime.fromtimestamp(stored[o].store_ts / 1000, utc)


def test_reader_sees_the_queues_ranges_times_and_group_offsets_the_broker_wrote(harness):
    h = harness.open()
    append(h, T, 0, 8)
    append(h, T, 2, 3)
    offsets = h.engine.offsets
    offsets.commit("g", T, 0, 6)
    offsets.persist()
    h.store.flush()
    stored = read_all(h.store, T, 0, 0, 8)
    reader = harness.reader()
    assert reader.queues() == {T: [0, 2]}
    assert reader.queue_range(T, 0) == (0, 8)
    assert reader.queue_range(T, 2) == (0, 3)
    assert reader.group_offsets() == {("g", T, 0): 6}
    assert reader.offset_for_timestamp(T, 0, stored[5].store_ts) <= 5
    assert reader.offset_for_timestamp(T, 0, stored[-1].store_ts + 60_000) == 8


def test_export_of_a_closed_store_reads_everything(harness):
    h = harness.open()
    append(h, T, 0, 1000)
    h.close()
    reader = harness.reader()
    table = pa.Table.from_batches(list(reader.export(T, 0, 0, 1000)))
    assert table.num_rows == 1000
    assert table.column("queue_offset").to_pylist() == list(range(1000))
    assert table.column("body").to_pylist()[999] == body_for(T, 0, 999)


def test_export_checks_a_batch_of_records_at_once_and_names_a_damaged_one(harness, monkeypatch):
    """Every exported record is verified (size, magic, position, crc), by one batched crc call per
    span of records rather than one Python call per record (the cost that held Spark reads of the
    key-value stores at ~1 us a row); a damaged record still stops the export, named exactly."""
    from equeue_core import record
    from equeue_core.errors import CorruptRecordError

    from .test_corruption import flip_last_byte

    h = harness.open()
    append(h, T, 0, 300)
    res = append(h, T, 0, 3)
    last = res.positions[2]
    size = len(h.store.read_queue(T, 0, 302, 1, 1 << 20).records)
    h.store.flush()
    crc_calls: list[int] = []
    batched = record.crc_spans
    monkeypatch.setattr(record, "crc_spans", lambda data, starts, ends: crc_calls.append(len(starts))
                        or batched(data, starts, ends))
    reader = harness.reader()
    offsets = [o for b in reader.export(T, 0, 0, 303) for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(303))
    assert sum(crc_calls) == 303 and len(crc_calls) <= 3, crc_calls
    h.close()

    opened = harness.open()
    flip_last_byte(harness, opened, res.positions[0], last, size)
    opened.close()
    with pytest.raises(CorruptRecordError) as err:
        for _ in harness.reader().export(T, 0, 0, 303):
            pass
    assert err.value.details == {"topic": T, "queue_id": 0, "offset": 302, "position": last}
