"""Corruption on read: the file store verifies every record it serves (crc and stamped position),
refuses a damaged one with its place, and the ring never hands out a torn copy.

Damage is made the LevelDB way: flip one byte of a stored record, or change a field and fix up the
crc so the deeper check (the position the index names) is the one that catches it.
"""

from __future__ import annotations

import pytest
from equeue_plugins.store_file import store as store_module
from equeue_plugins.store_file.constants import RING_PAGE
from equeue_plugins.store_file.ring import Ring

from equeue_core import record
from equeue_core.errors import CorruptRecordError

from .helpers import append, append_in_turn, bodies, chunk_and_offset, crash, fix_crc, flip_byte, open_store


@pytest.fixture(params=["record by record", "all at once"], autouse=True)
def verify_mode(request, monkeypatch) -> str:
    """Every test here runs twice: with the store's own threshold (these small pulls are checked
    record by record) and with every pull checked all at once (store.VERIFY_AT_ONCE = 1)."""
    if request.param == "all at once":
        monkeypatch.setattr(store_module, "VERIFY_AT_ONCE", 1)
    return request.param


def test_flipped_body_byte_is_refused_on_read_with_its_position(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    res = append(store, 6)
    store.close()
    file, at = chunk_and_offset(tmp_path, res.positions[3])
    flip_byte(file, at + record.HEADER_SIZE + 2)  # inside topic/body, covered by the crc
    store, _ = open_store(tmp_path)
    r = store.read_queue("t", 0, 0, 32, 1 << 20)
    assert (r.count, r.next_offset) == (3, 3), "the intact records before it are served, then it stops"
    assert bodies(r.records) == [b"m-0", b"m-1", b"m-2"]
    with pytest.raises(CorruptRecordError) as err:
        store.read_queue("t", 0, 3, 32, 1 << 20)
    assert err.value.details == {"topic": "t", "queue_id": 0, "offset": 3, "position": res.positions[3]}
    assert "crc" in str(err.value) and f"position {res.positions[3]}" in str(err.value)
    assert bodies(store.read_queue("t", 0, 4, 32, 1 << 20).records) == [b"m-4", b"m-5"]
    store.close()


def test_record_moved_with_a_valid_crc_is_refused_by_its_position(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    res = append(store, 3)
    store.close()
    file, at = chunk_and_offset(tmp_path, res.positions[1])
    flip_byte(file, at + record.OFF_POSITION)  # a record that claims another place...
    fix_crc(file, at)                          # ...with a crc that matches it
    store, _ = open_store(tmp_path)
    with pytest.raises(CorruptRecordError, match="position"):
        store.read_queue("t", 0, 1, 32, 1 << 20)
    store.close()


def test_records_written_by_an_earlier_process_are_verified_after_a_crash_too(tmp_path) -> None:
    """After a crash recovery verifies only the tail past the checkpoint; what lies below it is
    checked on read like after a clean stop."""
    store, _ = open_store(tmp_path)
    res = append(store, 4)
    store.close()  # the checkpoint now vouches for all four
    store, _ = open_store(tmp_path)
    append(store, 2)
    crash(store)
    file, at = chunk_and_offset(tmp_path, res.positions[0])
    flip_byte(file, at + record.HEADER_SIZE + 1)
    store, report = open_store(tmp_path)
    assert not report.clean
    with pytest.raises(CorruptRecordError, match="offset 0"):
        store.read_queue("t", 0, 0, 32, 1 << 20)
    assert bodies(store.read_queue("t", 0, 1, 32, 1 << 20).records) == [b"m-1", b"m-2", b"m-3", b"m-0", b"m-1"]
    store.close()


def _two_queues_then_reopen(tmp_path):
    """Queues 0 and 1 appended in turn, 5 records at a time (queue 0: 200 records in 40 runs),
    then the store closed and opened again, so every record lies below _verified_from."""
    store, _ = open_store(tmp_path)
    results = append_in_turn(store, 2, 40, 5)
    store.close()
    store, _ = open_store(tmp_path)
    return store, [p for r in results[0::2] for p in r.positions]


def test_a_large_pull_after_a_restart_is_checked_at_once(tmp_path, monkeypatch) -> None:
    """200 records of one queue in 40 runs after a reopen: served whole in one pull, with not one
    record checked on its own (the record-by-record check is never called)."""
    store, _ = _two_queues_then_reopen(tmp_path)
    calls = []
    one_by_one = store_module._first_damaged
    monkeypatch.setattr(store_module, "_first_damaged", lambda *a: calls.append(a) or one_by_one(*a))
    r = store.read_queue("t", 0, 0, 256, 1 << 24)
    assert (r.count, r.next_offset) == (200, 200)
    assert bodies(r.records) == [b"m-%d" % n for n in range(200)]
    tagged = store.read_queue("t", 0, 0, 256, 1 << 24, frozenset({0}))  # untagged records: hash 0
    assert tagged.count == 200 and tagged.records == r.records
    assert calls == []
    store.close()


def test_a_large_pull_after_a_restart_stops_before_a_damaged_record(tmp_path) -> None:
    """The same pull with record 150 damaged: the 150 before it are served, a pull that starts
    at it is refused with its place, and the 49 after it are served."""
    store, positions = _two_queues_then_reopen(tmp_path)
    store.close()
    file, at = chunk_and_offset(tmp_path, positions[150])
    flip_byte(file, at + record.HEADER_SIZE + 2)
    store, _ = open_store(tmp_path)
    r = store.read_queue("t", 0, 0, 256, 1 << 24)
    assert (r.count, r.next_offset) == (150, 150)
    assert bodies(r.records) == [b"m-%d" % n for n in range(150)]
    with pytest.raises(CorruptRecordError) as err:
        store.read_queue("t", 0, 150, 256, 1 << 24)
    assert err.value.details == {"topic": "t", "queue_id": 0, "offset": 150, "position": positions[150]}
    assert bodies(store.read_queue("t", 0, 151, 256, 1 << 24).records) == [b"m-%d" % n for n in range(151, 200)]
    store.close()


def test_ring_read_across_a_chunk_roll_gap_is_not_served_torn() -> None:
    """After a chunk roll the writer skips the rest of a chunk, so a newer lap can take a middle
    slot of a lagging reader's range while its first and last slots still hold the old pages."""
    ring = Ring(4 * RING_PAGE)
    old = [bytes([p]) * RING_PAGE for p in range(3)]
    for k, page in enumerate((10, 11, 12)):          # slots 2, 3, 0
        ring.write(page * RING_PAGE, old[k])
    ring.write(15 * RING_PAGE, b"\xee" * RING_PAGE)  # a roll jumps to page 15: slot 3, skipping 13, 14
    assert ring.read(10 * RING_PAGE, 13 * RING_PAGE) is None, "slot 3 no longer holds page 11"
    assert ring.read(12 * RING_PAGE, 13 * RING_PAGE) == old[2]  # untouched pages are still served
