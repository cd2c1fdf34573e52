"""records_to_arrow: the batched Arrow conversion every store reader's export uses."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from equeue_core import msgid, record
from equeue_core.export import arrow_schema, records_to_arrow

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
