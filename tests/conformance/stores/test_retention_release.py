"""What retention releases, on every store with units small enough to release: delete_before
returns the bytes it freed, the queues' minimum offsets move past them, reads below raise
OffsetOutOfRangeError (by position: MessageNotFoundError), and a second call has nothing left to
free. And delete_before on a worker thread beside the writer's appends (as the broker runs it)
never hides, loses or renumbers a record."""

from __future__ import annotations

import threading
import time

import pytest

from equeue_core import record
from equeue_core.errors import MessageNotFoundError, OffsetOutOfRangeError

from .kit import append, check_message, read_all

T = "released"
# store options that make a store's unit of retention small (a file-store chunk, a KV chunk)
SMALL_UNITS = {"file": {"chunk_size": 16384}, "lmdb": {"chunk_bytes": 2048}, "rocksdb": {"chunk_bytes": 2048}}


def _open(harness):
    return harness.open(**SMALL_UNITS.get(harness.name, {}))


def _position(h, queue_id: int, offset: int) -> int:
    res = h.store.read_queue(T, queue_id, offset, 1, 1 << 20)
    return record.header_fields(res.records)[5]


def test_delete_before_releases_bytes_moves_minimums_and_refuses_reads_below(harness):
    h = _open(harness)
    for _ in range(20):
        for q in range(3):
            append(h, T, q, 10)
    cut = _position(h, 0, 120)
    head = _position(h, 0, 0)
    released = h.store.delete_before(cut)
    assert 0 < released <= cut - head, f"released {released} bytes below a cut {cut - head} bytes in"
    for q in range(3):
        lo, hi = h.store.queue_range(T, q)
        assert hi == 200 and lo <= 120 + 20, f"queue {q}: [{lo}, {hi}) after a cut near offset 120"
        for i, msg in enumerate(read_all(h.store, T, q, lo, hi)):
            check_message(msg, T, q, lo + i)
        if lo:
            with pytest.raises(OffsetOutOfRangeError) as e:
                h.store.read_queue(T, q, lo - 1, 10, 1 << 20)
            assert e.value.min_offset == lo
    lo0 = h.store.queue_range(T, 0)[0]
    assert lo0 > 0, "the queue's minimum did not move although bytes were released"
    with pytest.raises(MessageNotFoundError):
        h.store.read_position(head)
    assert h.store.delete_before(cut) == 0, "a second call released the same bytes again"
    h.close()
    h = _open(harness)
    assert h.store.queue_range(T, 0) == (lo0, 200)


def test_delete_before_on_a_worker_thread_beside_appends_loses_nothing(harness):
    h = _open(harness)
    stop = threading.Event()
    errors: list[BaseException] = []
    released = []

    def retention() -> None:
        try:
            deadline = time.monotonic() + 90
            while not stop.is_set() and time.monotonic() < deadline:
                lo, hi = h.store.queue_range(T, 0)
                if hi - lo <= 60:
                    time.sleep(0.0005)  # let the appender get ahead (a spin would finish first)
                else:
                    try:
                        released.append(h.store.delete_before(_position(h, 0, hi - 30)))
                    except OffsetOutOfRangeError:
                        pass  # the minimum moved between queue_range and the read: go round again
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    worker = threading.Thread(target=retention, name="retention")
    worker.start()
    appends = 0
    deadline = time.monotonic() + 60
    try:
        # At least 400 appends, and on until retention has released something beside them (the
        # worker thread may not get the GIL early on a busy machine); bounded in count and time.
        while appends < 400 or (sum(released) == 0 and appends < 20_000 and time.monotonic() < deadline):
            assert append(h, T, 0, 3).first_queue_offset == 3 * appends, "an append was renumbered"
            appends += 1
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not errors, errors
    assert sum(released) > 0, "retention never released anything: the race was not run"
    lo, hi = h.store.queue_range(T, 0)
    assert hi == 3 * appends
    for i, msg in enumerate(read_all(h.store, T, 0, lo, hi)):
        check_message(msg, T, 0, lo + i)
    h.close()
    h = _open(harness)
    assert h.store.queue_range(T, 0) == (lo, 3 * appends)
    assert append(h, T, 0, 1).first_queue_offset == 3 * appends
