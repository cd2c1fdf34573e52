"""Flush and write errors in the file store are not permanent, and never vouched for: a failed
index fsync keeps the checkpoint below the data it covered (for the life of the process), a failed
index write is taken back so the next append works. Failures are real OS errors: the index's
write descriptor is swapped for a pipe's read end (fdatasync: EINVAL, write: EBADF)."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
from equeue_plugins.store_file import store as store_module
from equeue_plugins.store_file.constants import CHECKPOINT
from equeue_plugins.store_file.recovery import read_checkpoint

from equeue_core.errors import StoreError

from .helpers import append, bodies, open_store, read_all


@contextmanager
def failing_index_fd(store, topic: str = "t", queue_id: int = 0):
    q = store.index._queues[(topic, queue_id)]
    r, w = os.pipe()
    real, q.fd = q.fd, r
    try:
        yield q
    finally:
        q.fd = real
        os.close(r)
        os.close(w)


def _flush(store) -> None:
    store._flusher.wait(store.log.published_end).result(timeout=10)


def test_checkpoint_never_vouches_for_data_whose_fsync_failed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 3600.0)  # rounds only when called
    store, _ = open_store(tmp_path)  # async flush
    a = append(store, 3)
    assert store._checkpoint_round()
    good = read_checkpoint(str(tmp_path / CHECKPOINT))
    assert good == a.end_position
    b = append(store, 2)
    with failing_index_fd(store) as q:
        q.dirty = True
        with pytest.raises(OSError):
            store._checkpoint_round()  # the round that fsyncs the index
        # the log's flush does not depend on the index: b's sends are durable and answered
        store._flusher.wait(b.end_position).result(timeout=10)
    c = append(store, 2)
    assert store._checkpoint_round()  # works again, without a restart
    _flush(store)
    assert store._flusher.flushed == c.end_position
    assert read_checkpoint(str(tmp_path / CHECKPOINT)) == good, "a checkpoint vouched for a failed fsync"
    store.close()
    assert read_checkpoint(str(tmp_path / CHECKPOINT)) == good, "not even at a clean close"
    store, report = open_store(tmp_path)
    assert report.records == 4, "the next open verifies everything after the last good flush"
    assert bodies(store.read_queue("t", 0, 0, 10, 1 << 20).records) == [
        b"m-0", b"m-1", b"m-2", b"m-0", b"m-1", b"m-0", b"m-1"]
    store.close()


def test_failed_index_write_is_taken_back_and_the_next_append_works(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    append(store, 3)
    end = store.log.published_end
    q = store.index._queues[("t", 0)]
    r, w = os.pipe()
    real, q.fd = q.fd, os.dup(r)  # writes to a pipe's read end fail (EBADF)
    try:
        with pytest.raises(StoreError, match="nothing stored"):
            append(store, 2, first_number=100)
    finally:
        for fd in (real, r, w):
            os.close(fd)
    assert store.log.write_pos == end and store.queue_range("t", 0) == (0, 3)
    res = append(store, 2, first_number=3)
    assert res.first_queue_offset == 3 and res.positions[0] == end
    assert [m.body for m in read_all(store)] == [b"m-%d" % i for i in range(5)]
    store.close()
    store, report = open_store(tmp_path)
    assert report.lost == [] and [m.body for m in read_all(store)] == [b"m-%d" % i for i in range(5)]
    store.close()
