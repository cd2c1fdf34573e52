"""The in-memory ring after a reopen: the first write lands in the middle of a ring page, so the
ring must not claim the older bytes of that page (found by the scheduler's kill -9 test: records
written before a restart read back as zeros and failed verification)."""

from __future__ import annotations

from equeue_core import record
from tests.store_file.helpers import make_batch, open_store


def test_records_before_a_reopen_in_the_same_ring_page_still_read_back(tmp_path) -> None:
    store, _ = open_store(tmp_path, chunk_size=16 * 1024 * 1024)
    batch, starts = make_batch(50, topic="t")  # well inside the first 64 KiB ring page
    old = store.append("t", 0, batch, starts)
    store.close()
    store, _ = open_store(tmp_path, chunk_size=16 * 1024 * 1024)
    try:
        batch, starts = make_batch(1, topic="t", first_number=50)
        store.append("t", 0, batch, starts)  # written mid-page into a fresh ring
        for i, pos in enumerate(old.positions):
            m = record.decode(store.read_position(pos))
            assert m.body == b"m-%d" % i
    finally:
        store.close()
