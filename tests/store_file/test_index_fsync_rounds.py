"""A flush round fsyncs the index only when it writes the checkpoint.

A flush=sync send is durable once its record is in the fsynced log; its index entry is derived
data that recovery rebuilds from the log past the checkpoint. So rounds between checkpoints fsync
the log alone (one fsync per sync send instead of two), and a checkpoint round fsyncs the index
before the checkpoint vouches for it. The second test is the crash that relies on: index writes
made after the checkpoint are lost, every acknowledged record is still served at its offset.
"""

from __future__ import annotations

import os

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

    # a checkpoint round fsyncs the index before writing the checkpoint
    synced.clear()
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 0.0)
    checkpointed = store._checkpointed
    store.wait_flushed(append(store, 5).end_position).result(timeout=30)
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

    from equeue_core.errors import StoreError

    from .test_flush_errors import failing_index_fd

    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 3600.0)
    store, _ = open_store(tmp_path, flush="sync")
    good = read_checkpoint(str(tmp_path / CHECKPOINT))
    a = append(store, 3)
    store.wait_flushed(a.end_position).result(timeout=30)  # log only: a's index entries not fsynced
    monkeypatch.setattr(store_module, "CHECKPOINT_EVERY_SECONDS", 0.0)
    b = append(store, 2)
    with failing_index_fd(store) as q:
        q.dirty = True
        try:
            store.wait_flushed(b.end_position).result(timeout=30)
        except StoreError:
            pass
        else:
            raise AssertionError("the failed index fsync was not reported")
    c = append(store, 2)
    store.wait_flushed(c.end_position).result(timeout=30)  # works again
    assert read_checkpoint(str(tmp_path / CHECKPOINT)) == good, "a checkpoint vouched for unsynced index entries"
    monkeypatch.undo()
    store.close()
    store, report = open_store(tmp_path)
    assert [m.queue_offset for m in read_all(store)] == list(range(7))
    store.close()
