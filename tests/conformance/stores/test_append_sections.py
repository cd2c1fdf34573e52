"""A SEND_MULTI's sections stored with one call (equeue_core/store_sections.py): through the
store's own `append_sections` where it has one (the file store), and one `append` per section
(`append_one_by_one`, what every other store gets) for every store: the same offsets, stamps,
index entries and reads as separate appends, across a reopen."""

from __future__ import annotations

import pytest

from equeue_core.store_sections import append_one_by_one, append_sections

from .kit import check_message, make_batch, read_all

WAYS = {"store's own": append_sections, "one by one": append_one_by_one}


@pytest.mark.parametrize("way", list(WAYS))
def test_sections_get_what_separate_appends_give(harness, way):
    """Three queues of two topics, one of them twice in the request (its offsets run on across
    its sections), after an earlier plain append: positions grow in section order, each
    result's end is its section's, and every record reads back as laid out, also after a
    reopen (the file store's recovery rescans the log written with one write(2))."""
    h = harness.open()
    pre, pre_starts = make_batch("ms.a", 0, 0, 5)
    h.store.append("ms.a", 0, pre, pre_starts)
    layout = [("ms.a", 0, 5, 3), ("ms.b", 2, 0, 4), ("ms.a", 0, 8, 2), ("ms.a", 1, 0, 1)]
    sections = []
    for topic, queue_id, first, count in layout:
        buf, starts = make_batch(topic, queue_id, first, count)
        sections.append((topic, queue_id, buf, starts))
    results, failed = WAYS[way](h.store, sections)
    assert failed is None and len(results) == 4
    assert [r.first_queue_offset for r in results] == [5, 0, 8, 0]
    positions = [p for r in results for p in r.positions]
    assert positions == sorted(positions) and len(set(positions)) == 10
    for r, (_, _, buf, _) in zip(results, sections, strict=True):
        assert r.end_position == r.positions[0] + len(buf)
    h.store.wait_flushed(results[-1].end_position).result(timeout=10)
    expected = {("ms.a", 0): 10, ("ms.b", 2): 4, ("ms.a", 1): 1}
    for reopened in (False, True):
        if reopened:
            h.close()
            h = harness.open()
        for (topic, queue_id), end in expected.items():
            assert h.store.queue_range(topic, queue_id) == (0, end)
            for offset, msg in enumerate(read_all(h.store, topic, queue_id, 0, end)):
                check_message(msg, topic, queue_id, offset)
    buf, starts = make_batch("ms.a", 0, 10, 1)  # the next plain append follows on
    assert h.store.append("ms.a", 0, buf, starts).first_queue_offset == 10


@pytest.mark.parametrize("way", list(WAYS))
def test_a_section_that_cannot_be_stored_stops_the_rest(harness, way):
    """A batch larger than a chunk of the file store's log (its chunk set to 1 MiB here) cannot
    be stored: the sections before it are stored, it and the ones after it are not, and the
    error says why; as the first section it stores nothing and raises. A store without a limit
    per batch (lmdb, rocksdb) stores all three."""
    h = harness.open(chunk_size=1 << 20)
    ok, ok_starts = make_batch("big.a", 0, 0, 2)
    huge, huge_starts = make_batch("big.b", 0, 0, 1800)  # ~1.25 MiB of records
    later, later_starts = make_batch("big.a", 0, 2, 2)
    assert len(huge) > 1 << 20
    results, failed = WAYS[way](h.store, [("big.a", 0, ok, ok_starts), ("big.b", 0, huge, huge_starts),
                                        ("big.a", 0, later, later_starts)])
    if failed is None:
        assert harness.name != "file"
        assert [r.first_queue_offset for r in results] == [0, 0, 2]
        return
    assert "does not fit in a chunk" in str(failed)
    assert len(results) == 1 and results[0].first_queue_offset == 0
    assert h.store.queue_range("big.a", 0) == (0, 2) and h.store.queue_range("big.b", 0)[1] == 0
    with pytest.raises(type(failed)):
        WAYS[way](h.store, [("big.b", 0, bytearray(huge), huge_starts)])
    again, again_starts = make_batch("big.a", 0, 2, 2)
    assert h.store.append("big.a", 0, again, again_starts).first_queue_offset == 2
