"""Index holes below the checkpoint: a lost or truncated index file must be rebuilt from the log at
open (every message visible at its original offset, no offset handed out twice), and the recovery
report must list exactly which ranges were rebuilt or lost. Each case runs after a clean stop and
after a crash (helpers.crash: files as written, abort marker kept)."""

from __future__ import annotations

import os

import pytest
from equeue_plugins.store_file.constants import INDEX_DIR

from equeue_core.contracts import IndexRange
from equeue_core.errors import CorruptRecordError

from .helpers import append, chunk_and_offset, crash, index_file, open_store, read_all

# helpers.settings: 64 index entries per file, so 150 records make files 0, 64 and 128


def _fill(tmp_path, stop: str):
    store, _ = open_store(tmp_path)
    append(store, 150, queue_id=0)
    append(store, 5, queue_id=1)
    if stop == "clean":
        store.close()
    else:
        store.flush()
        store._write_checkpoint(store.log.published_end)  # the flusher's periodic checkpoint
        crash(store)


def _check_visible_and_continuing(store) -> None:
    assert [m.queue_offset for m in read_all(store, "t", 0)] == list(range(150))
    assert [m.body for m in read_all(store, "t", 0)] == [b"m-%d" % (i % 150) for i in range(150)]
    assert append(store, 1, queue_id=0).first_queue_offset == 150, "an offset was handed out twice"
    assert [m.queue_offset for m in read_all(store, "t", 1)] == list(range(5))


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_deleted_middle_index_file_is_rebuilt_from_the_log(tmp_path, stop) -> None:
    _fill(tmp_path, stop)
    os.unlink(index_file(tmp_path, "t", 0, 64))
    store, report = open_store(tmp_path)
    assert report.rebuilt == [IndexRange("t", 0, 0, 149)] and report.lost == []
    _check_visible_and_continuing(store)
    store.close()


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_truncated_last_index_file_is_rebuilt_and_offsets_are_not_reused(tmp_path, stop) -> None:
    _fill(tmp_path, stop)
    os.truncate(index_file(tmp_path, "t", 0, 128), 20 * 3)  # offsets 131..149 gone from the index
    store, report = open_store(tmp_path)
    assert report.rebuilt == [IndexRange("t", 0, 0, 149)] and report.lost == []
    _check_visible_and_continuing(store)
    store.close()


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_deleted_queue_index_directory_is_rebuilt(tmp_path, stop) -> None:
    import shutil

    _fill(tmp_path, stop)
    shutil.rmtree(tmp_path / INDEX_DIR / "t" / "0")
    store, report = open_store(tmp_path)
    assert report.rebuilt == [IndexRange("t", 0, 0, 149)] and report.lost == []
    _check_visible_and_continuing(store)
    store.close()


def test_lost_index_file_and_unreadable_log_stretch_reports_the_lost_offsets(tmp_path) -> None:
    store, _ = open_store(tmp_path)
    res = append(store, 150, queue_id=0)
    store.close()
    os.unlink(index_file(tmp_path, "t", 0, 64))
    file, at = chunk_and_offset(tmp_path, res.positions[140])
    with open(file, "r+b") as f:  # record 140 and everything after it in its chunk unreadable
        f.seek(at)
        f.write(b"\0" * 4)
    store, report = open_store(tmp_path)
    assert report.lost == [IndexRange("t", 0, 140, 149)], report.notes
    assert report.rebuilt == [IndexRange("t", 0, 0, 139)]
    assert store.queue_range("t", 0) == (0, 150)
    with pytest.raises(CorruptRecordError, match="lost"):
        store.read_queue("t", 0, 140, 10, 1 << 20)
    assert append(store, 1).first_queue_offset == 150
    store.close()


def test_index_fsync_error_is_not_swallowed(tmp_path) -> None:
    """A failing fsync of an index file must reach the flusher (so no checkpoint is written for
    it), not be swallowed as "closed meanwhile". The failure is a real one: fdatasync on a
    descriptor the kernel refuses (a pipe gives EINVAL), put where the index's write fd is."""
    store, _ = open_store(tmp_path)
    append(store, 3)
    q = store.index._queues[("t", 0)]
    r, w = os.pipe()
    real, q.fd = q.fd, r
    q.dirty = True
    try:
        with pytest.raises(OSError):
            store.index.flush()
        assert q.dirty, "entries whose fsync failed must be fsynced again by the next flush"
    finally:
        q.fd = real
        os.close(r)
        os.close(w)
    store.close()
