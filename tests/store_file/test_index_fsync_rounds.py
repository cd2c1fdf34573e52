"""The flusher fsyncs the log only; the checkpointer fsyncs the index before each checkpoint.

A flush=sync send is durable once its record is in the fsynced log; its index entry is derived
data that recovery rebuilds from the log past the checkpoint. So a sync send waits for one fsync
(the log's), never for the index: a checkpoint round, on its own thread, fsyncs the index before
the checkpoint vouches for it, and sends go on meanwhile. One test is the crash that relies on
this: index writes made after the checkpoint are lost, every acknowledged record is still served
at its offset.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from equeue_plugins.store_file import store as store_module
from equeue_plugins.store_file.constants import CHECKPOINT, INDEX_DIR
from equeue_plugins.store_file.recovery import read_checkpoint_queues

from .helpers import append, crash, open_store, read_all


def index_fds(store) -> set[int]:
    return {q.fd for q in store.index._queues.values() if q.fd >= 0}


def test_sync_sends_between_checkpoints_fsync_the_log_only(tmp_path, monkeypatch) -> None:
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:  # records the descriptor, then does the real fdatasync
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 3600.0)  # no checkpoint rounds
    store, _ = open_store(tmp_path, flush="sync")
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    for _ in range(10):
        store.wait_flushed(append(store, 5).end_position).result(timeout=30)
    assert synced, "a sync wait is answered only after an fsync"
    assert not index_fds(store) & set(synced), "the index was fsynced in a round without a checkpoint"
    assert store.log._fd in synced

    # a checkpoint round (the checkpointer thread's) fsyncs the index before writing the checkpoint
    synced.clear()
    checkpointed = store._checkpointed
    store.wait_flushed(append(store, 5).end_position).result(timeout=30)
    assert store._checkpoint_round()
    assert index_fds(store) <= set(synced)
    assert store._checkpointed > checkpointed
    monkeypatch.undo()
    store.close()


def test_index_writes_lost_after_the_checkpoint_are_rebuilt_from_the_log(tmp_path, monkeypatch) -> None:
    """Sync sends after the last checkpoint, then a crash that loses every index write the flusher
    did not fsync (the index files cut back to the checkpoint's queue ends): reopened, every
    acknowledged record is served, at its offset, and the next append continues after them."""
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 3600.0)
    store, _ = open_store(tmp_path, flush="sync")
    acked = []
    for i in range(12):
        r = append(store, 4, first_number=4 * i)
        store.wait_flushed(r.end_position).result(timeout=30)  # the send is acknowledged now
        acked.append(r)
    crash(store)
    found = read_checkpoint_queues(os.path.join(tmp_path, CHECKPOINT))
    assert found is not None
    _position, ends = found
    kept = ends.get(("t", 0), 0)
    assert kept < 48, "the checkpoint should predate the sends"
    qdir = tmp_path / INDEX_DIR / "t" / "0"
    for f in sorted(qdir.iterdir()):  # lose the index entries written after the checkpoint
        first = int(f.name)
        keep = max(0, min(kept - first, 64)) * 20
        if f.stat().st_size > keep:
            os.truncate(f, keep)
    store, report = open_store(tmp_path)
    assert store.queue_range("t", 0) == (0, 48)
    msgs = read_all(store)
    assert [m.queue_offset for m in msgs] == list(range(48))
    assert [m.body for m in msgs] == [b"m-%d" % i for i in range(48)]
    assert [r.first_queue_offset for r in acked] == list(range(0, 48, 4))
    assert append(store, 1).first_queue_offset == 48
    store.close()


def test_a_failed_index_fsync_keeps_the_checkpoint_below_index_entries_never_fsynced(tmp_path, monkeypatch) -> None:
    """Log-only rounds move the durable log end past the last index fsync; when the next
    checkpoint round's index fsync fails, no later checkpoint may vouch for the index entries
    written since the last round whose index fsync worked (their pages may be gone)."""
    from equeue_plugins.store_file.recovery import read_checkpoint

    from .test_flush_errors import failing_index_fd

    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 3600.0)
    store, _ = open_store(tmp_path, flush="sync")
    good = read_checkpoint(str(tmp_path / CHECKPOINT))
    a = append(store, 3)
    store.wait_flushed(a.end_position).result(timeout=30)  # log only: a's index entries not fsynced
    b = append(store, 2)
    with failing_index_fd(store) as q:
        q.dirty = True
        with pytest.raises(OSError):
            store._checkpoint_round()
        # b's records are in the fsynced log: the failed index fsync does not fail its sends
        store.wait_flushed(b.end_position).result(timeout=30)
    c = append(store, 2)
    store.wait_flushed(c.end_position).result(timeout=30)
    assert store._checkpoint_round()  # works again
    assert read_checkpoint(str(tmp_path / CHECKPOINT)) == good, "a checkpoint vouched for unsynced index entries"
    monkeypatch.undo()
    store.close()
    store, report = open_store(tmp_path)
    assert [m.queue_offset for m in read_all(store)] == list(range(7))
    store.close()


def test_a_sync_send_never_waits_for_a_checkpoint_round_stuck_in_the_index_fsync(tmp_path, monkeypatch) -> None:
    """Before: the checkpoint round ran inside a flush, so every flush=sync send waited for the
    index fsyncs (1000 written queues: 1000 fdatasyncs, ~0.2 s here, once a second). Here the
    index fsync of a checkpoint round is held (a slow disk) and sync sends are still answered."""
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 0.05)
    store, _ = open_store(tmp_path, flush="sync")
    entered = threading.Event()
    release = threading.Event()
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:  # the index's descriptors wait for `release`, then sync
        if fd in index_fds(store):
            entered.set()
            release.wait(60)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    try:
        first = append(store, 3)
        store.wait_flushed(first.end_position).result(timeout=30)
        sent = 3
        for _ in range(200):  # sync sends until a checkpoint round is stuck in the index fsync
            if entered.is_set():
                break
            store.wait_flushed(append(store, 1, first_number=sent).end_position).result(timeout=10)
            sent += 1
            time.sleep(0.01)
        assert entered.is_set(), "no checkpoint round fsynced the index"
        for _ in range(5):  # the round is stuck meanwhile; these sends are answered all the same
            store.wait_flushed(append(store, 2, first_number=sent).end_position).result(timeout=10)
            sent += 2
        assert store._checkpointed < first.end_position, "the stuck round wrote its checkpoint"
    finally:
        release.set()
    for _ in range(200):  # at most ~10 s
        if store._checkpointed >= first.end_position:
            break
        time.sleep(0.05)
    assert store._checkpointed >= first.end_position, "the round did not finish once the disk answered"
    monkeypatch.undo()
    store.close()
    store, _ = open_store(tmp_path)
    assert [m.queue_offset for m in read_all(store)] == list(range(sent))
    store.close()
