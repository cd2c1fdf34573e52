"""records_to_arrow: the batched Arrow conversion every store reader's export uses."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue_core import msgid, record
from equeue_core.export import (
    COLUMNS,
    RowFilter,
    arrow_schema,
    first_damaged,
    layout_to_arrow,
    records_to_arrow,
)

ADDRESS = ("127.0.0.1", 10911)

messages = st.lists(st.tuples(
    st.text(alphabet="abcXYZ09_.-", min_size=1, max_size=20),
    st.binary(max_size=300),
    st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    st.lists(st.text(alphabet=st.characters(blacklist_characters="\x1f", blacklist_categories=("Cs",)),
                     min_size=1, max_size=8), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
), min_size=0, max_size=40)


def _stamped(msgs) -> bytearray:
    batch = bytearray(b"".join(record.encode_record(t, b, tag, keys, props) for t, b, tag, keys, props in msgs))
    starts = record.scan(batch)
    record.stamp_batch(batch, starts, [1000 + s for s in starts], 7, 3, 1_700_000_000_123)
    return batch


@settings(max_examples=60, deadline=None)
@given(messages)
def test_every_column_matches_a_record_by_record_decode(msgs):
    batch = _stamped(msgs)
    starts = record.scan(batch)
    rb = records_to_arrow(((batch, s) for s in starts), ADDRESS)
    assert rb.schema == arrow_schema()
    rows = rb.to_pylist()
    assert len(rows) == len(msgs)
    for row, s in zip(rows, starts, strict=True):
        m = record.decode(batch, s)
        assert row["topic"] == m.topic and row["body"] == m.body and row["tag"] == m.tag
        assert row["keys"] == list(m.keys) and dict(row["properties"]) == m.properties
        assert (row["queue_id"], row["queue_offset"]) == (m.queue_id, m.queue_offset)
        assert row["msg_id"] == msgid.encode(*ADDRESS, m.position)
        assert row["store_ts"] == dt.datetime.fromtimestamp(m.store_ts / 1000, dt.UTC)
        assert row["born_ts"] == dt.datetime.fromtimestamp(m.born_ts / 1000, dt.UTC)


def test_records_from_several_buffers_make_one_batch():
    a, b = _stamped([("t", b"one", None, [], {})]), _stamped([("t", b"two", "x", ["k"], {"p": "v"})])
    rb = records_to_arrow([(a, 0), (memoryview(b), 0)], ADDRESS)
    assert rb.column("body").to_pylist() == [b"one", b"two"]
    assert rb.column("tag").to_pylist() == [None, "x"]


@settings(max_examples=40, deadline=None)
@given(messages, st.randoms(use_true_random=False))
def test_records_in_any_buffer_order_decode_like_records_in_order(msgs, rnd):
    """Starts out of buffer order (records_to_arrow accepts any order) take the binary-view path,
    starts in order the ordered-ranges path: both give every column of every record, row i being
    the record at starts[i]."""
    batch = _stamped(msgs)
    starts = record.scan(batch)
    shuffled = list(starts)
    rnd.shuffle(shuffled)
    got = layout_to_arrow(bytes(batch), shuffled, ADDRESS).to_pylist()
    in_order = {s: row for s, row in zip(starts, layout_to_arrow(bytes(batch), starts, ADDRESS).to_pylist(),
                                          strict=True)}
    assert got == [in_order[s] for s in shuffled]
    for row, s in zip(got, shuffled, strict=True):
        m = record.decode(batch, s)
        assert (row["topic"], row["tag"], row["body"], row["keys"]) == (m.topic, m.tag, m.body, list(m.keys))
        assert dict(row["properties"]) == m.properties


column_subsets = st.lists(st.sampled_from(COLUMNS), unique=True, min_size=1, max_size=len(COLUMNS))
tag_sets = st.one_of(st.none(), st.frozensets(st.text(min_size=1, max_size=10), max_size=3))


@settings(max_examples=60, deadline=None)
@given(messages, column_subsets, tag_sets, tag_sets, st.one_of(st.none(), st.booleans()),
       st.one_of(st.none(), st.integers(0, 4)), st.one_of(st.none(), st.integers(0, 4)))
def test_pruned_columns_and_row_filter_match_filtering_the_full_batch(msgs, cols, tag_in, tag_not_in, tag_is_null,
                                                                       ts_min, ts_max):
    """A pruned, filtered export equals the full export with the rows filtered in Python (Spark's
    null semantics: an untagged row matches neither tag_in nor tag_not_in)."""
    batch = bytearray(b"".join(record.encode_record(t, b, tag, keys, props) for t, b, tag, keys, props in msgs))
    starts = record.scan(batch)
    for i, s in enumerate(starts):  # store times 0, 1, 2, ... so the time filter cuts somewhere
        record.stamp_batch(batch, [s], [1000 + s], i, 3, i % 5)
    full = records_to_arrow(((batch, s) for s in starts), ADDRESS).to_pylist()
    rf = RowFilter(tag_in=tag_in, tag_not_in=tag_not_in, tag_is_null=tag_is_null,
                   store_ts_min=ts_min, store_ts_max=ts_max)

    def keep(row) -> bool:
        tag, ts = row["tag"], int(row["store_ts"].timestamp() * 1000)
        return ((tag_in is None or tag in tag_in) and (tag_not_in is None or (tag is not None and tag not in tag_not_in))
                and (tag_is_null is None or (tag is None) == tag_is_null)
                and (ts_min is None or ts >= ts_min) and (ts_max is None or ts <= ts_max))

    expected = [{c: row[c] for c in cols} for row in full if keep(row)]
    rb = layout_to_arrow(bytes(batch), starts, ADDRESS, cols, rf)
    assert rb.schema == arrow_schema(cols)
    assert rb.to_pylist() == expected


CRC_IMPLS = ["python"] + (["native"] if record.native is not None else [])


@pytest.mark.parametrize("impl", CRC_IMPLS)
def test_first_damaged_finds_a_flipped_byte_and_a_wrong_position(impl, monkeypatch):
    """One batched crc call (record.crc_spans) checks every record, in C and in the Python fallback."""
    crc_spans = record.PYTHON_FUNCTIONS["crc_spans"] if impl == "python" else record.NATIVE_FUNCTIONS["crc_spans"]
    calls = []
    monkeypatch.setattr(record, "crc_spans", lambda *a: calls.append(a) or crc_spans(*a))
    batch = _stamped([("t", b"a" * 50, None, [], {}), ("t", b"b" * 50, "x", [], {}), ("t", b"c", None, [], {})])
    starts = record.scan(batch)
    sizes = [record.record_size(batch, s) for s in starts]
    positions = [1000 + s for s in starts]
    assert first_damaged(bytes(batch), starts, sizes, positions) is None
    flipped = bytearray(batch)
    flipped[starts[1] + sizes[1] - 3] ^= 0xFF  # inside the second body: only the crc can tell
    assert first_damaged(bytes(flipped), starts, sizes, positions) == 1
    assert first_damaged(bytes(batch), starts, sizes, [positions[0], positions[1], 7]) == 2
    assert first_damaged(bytes(batch), starts, [sizes[0], 0, sizes[2]], positions) == 1  # a "lost" entry
    assert len(calls) == 2  # one crc call per batch whose headers check out, not one per record


@pytest.mark.parametrize("store", ["file", "lmdb", "rocksdb"])
def test_a_batch_never_holds_more_record_bytes_than_arrow_can_address(store, tmp_path, monkeypatch):
    """Large bodies: export cuts batches by bytes (MAX_BATCH_BYTES, lowered here) instead of
    building a column whose 32-bit offsets would wrap; every record still comes back, in order."""
    import equeue_plugins.store_file.reader as file_reader

    from equeue_core import export
    from equeue_core.contracts import StoreSettings
    from equeue_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    data = str(tmp_path)
    engine = pm.store_engine(store)(StoreSettings(data_dir=data))
    try:
        bodies = [bytes([i % 251]) * 20_000 for i in range(300)]
        batch = bytearray(b"".join(record.encode_record("t", b) for b in bodies))
        engine.messages.append("t", 0, batch, record.scan(batch))
        engine.messages.flush()
    finally:
        engine.close()
    monkeypatch.setattr(export, "MAX_BATCH_BYTES", 100_000)
    monkeypatch.setattr(file_reader, "MAX_BATCH_BYTES", file_reader._MAX_SPAN + 100_000)
    reader = pm.store_reader(store)(data, {})
    try:
        batches = list(reader.export("t", 0, 0, 300, columns=["queue_offset", "body"]))
    finally:
        reader.close()
    assert len(batches) >= 2
    assert [o for b in batches for o in b.column("queue_offset").to_pylist()] == list(range(300))
    assert [x for b in batches for x in b.column("body").to_pylist()] == bodies
