"""Corruption refused on read, on every store: a record whose bytes changed after they were
stored is never served. A pull serves the intact records before it and stops there; a pull that
starts at it raises CorruptRecordError naming topic, queue, queue offset and position, so an
operator can skip exactly that record; the records after it stay readable, and a reader's export
refuses it too.

The damage is one flipped byte in the last record of a batch, made with the store closed in
between so no in-memory copy (the file store's ring) can hide it.
"""

from __future__ import annotations

import os

import pytest

from equeue_core.errors import CorruptRecordError
from equeue_core.record import tag_hash

from .kit import append, check_message, read_all, tag_for, verified_messages


def flip_last_byte(harness, opened, batch_position: int, position: int, size: int) -> None:
    """Flip the last byte of the record at `position` (in the batch stored at batch_position)."""
    if harness.name == "file":
        from equeue_plugins.store_file.constants import COMMITLOG_DIR, file_name

        cs = opened.store.chunk_size
        path = os.path.join(harness.data_dir, COMMITLOG_DIR, file_name(position - position % cs))
        at = position % cs + size - 1
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
        return
    from .test_engine_specific import _flip_a_body_byte  # a batch is one value: its last byte is the record's

    _flip_a_body_byte(harness.name, opened.store, batch_position)


def test_corrupt_record_is_refused_on_read_with_its_position(harness):
    opened = harness.open()
    res = append(opened, "t", 0, 3)
    append(opened, "t", 0, 2)
    last = res.positions[2]
    size = len(opened.store.read_queue("t", 0, 2, 1, 1 << 20).records)
    flip_last_byte(harness, opened, res.positions[0], last, size)
    opened.close()
    opened = harness.open()
    store = opened.store

    pulled = store.read_queue("t", 0, 0, 32, 1 << 20)
    assert (pulled.count, pulled.next_offset) == (2, 2), "intact records before it are served, then the pull stops"
    for o, m in enumerate(verified_messages(pulled.records)):
        check_message(m, "t", 0, o)
    with pytest.raises(CorruptRecordError) as err:
        store.read_queue("t", 0, 2, 32, 1 << 20)
    assert err.value.details == {"topic": "t", "queue_id": 0, "offset": 2, "position": last}
    assert f"t/0 offset 2 (position {last})" in str(err.value)
    with pytest.raises(CorruptRecordError):  # a tag filter that picks it refuses it too
        store.read_queue("t", 0, 2, 32, 1 << 20, frozenset({tag_hash(tag_for(2))}))
    for m, o in zip(read_all(store, "t", 0, 3, 5), (3, 4), strict=True):
        check_message(m, "t", 0, o)
    opened.store.flush()

    reader = harness.reader()
    with pytest.raises(CorruptRecordError):
        for _ in reader.export("t", 0, 0, 5):
            pass

