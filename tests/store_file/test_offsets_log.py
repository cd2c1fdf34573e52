"""The offsets log: a persist appends what changed since the one before; the snapshot is written
again only past the log's size; a torn last append, a stale log, a failed append and an older
store's snapshot are each read right, and a killed broker keeps what it persisted."""

from __future__ import annotations

import errno
import json
import os
import time

import pytest
from equeue_plugins.store_file import offsets as offsets_module
from equeue_plugins.store_file.constants import OFFSETS
from equeue_plugins.store_file.offsets import FileOffsetStore, load_offsets
from equeue_plugins.store_file.offsets_log import DELETED, encode_record, log_path, read_records
from equeue_plugins.store_file.reader import FileStoreReader

from equeue_core.client import Consumer, Message, Producer
from equeue_core.contracts import StoreSettings
from tests.helpers.broker import BrokerProcess, create_topic
from tests.helpers.counting import CountingHandler
from tests.helpers.held_write import assert_commit_not_blocked_by_write


def _store(path) -> FileOffsetStore:
    return FileOffsetStore(StoreSettings(str(path)))


def _generation(path) -> int:
    return json.loads((path / OFFSETS).read_text())["log"]


def test_a_persist_appends_only_what_changed(tmp_path) -> None:
    store = _store(tmp_path)
    for q in range(10_000):
        store.commit("big", "t", q, q)
    store.commit("gone", "t", 0, 7)
    store.persist()  # the first: a snapshot (there is no log yet)
    inode, generation = os.stat(tmp_path / OFFSETS).st_ino, _generation(tmp_path)
    store.commit("big", "t", 5, 500)
    store.commit("new", "u", 2, 3)
    store.delete_group("gone")
    store.persist()
    assert os.stat(tmp_path / OFFSETS).st_ino == inode  # the snapshot was not written again
    log = log_path(str(tmp_path), generation)
    assert 0 < os.path.getsize(log) < 200  # three changes, not 10k offsets
    store.persist()  # nothing changed: nothing appended
    assert os.path.getsize(log) < 200
    again = _store(tmp_path).all()
    assert again[("big", "t", 5)] == 500 and again[("big", "t", 9999)] == 9999
    assert again[("new", "u", 2)] == 3 and ("gone", "t", 0) not in again and len(again) == 10_001
    assert FileStoreReader(str(tmp_path), {}).group_offsets() == again  # readers replay the log too


def test_the_log_is_folded_into_a_new_snapshot_once_it_outgrows_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(offsets_module, "COMPACT_MIN_BYTES", 0)
    store = _store(tmp_path)
    store.commit("g", "t", 0, 1)
    store.persist()
    first = _generation(tmp_path)
    for i in range(2, 40):  # the snapshot holds one offset: the log outgrows it within a few persists
        store.commit("g", "t", 0, i)
        store.commit("g", "t", 1, i)
        store.persist()
    assert _generation(tmp_path) > first
    logs = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".log"))
    assert logs in ([], [os.path.basename(log_path(str(tmp_path), _generation(tmp_path)))])  # old logs removed
    assert _store(tmp_path).all() == {("g", "t", 0): 39, ("g", "t", 1): 39}


def test_a_torn_last_append_is_ignored_and_cut_before_the_next(tmp_path) -> None:
    store = _store(tmp_path)
    store.commit("g", "t", 0, 1)
    store.persist()
    store.commit("g", "t", 0, 2)
    store.persist()
    store.close()
    log = log_path(str(tmp_path), _generation(tmp_path))
    whole = os.path.getsize(log)
    torn = encode_record([(("g", "t", 0), 3)])
    with open(log, "ab") as f:  # a crash in the middle of an append
        f.write(torn[:-2])
    assert load_offsets(str(tmp_path)).offsets == {("g", "t", 0): 2}  # a reader stops before it
    store = _store(tmp_path)  # the writer cuts it off, so what it appends next is read
    assert os.path.getsize(log) == whole and store.get("g", "t", 0) == 2
    store.commit("g", "t", 0, 4)
    store.persist()
    assert _store(tmp_path).get("g", "t", 0) == 4
    damaged = bytearray(encode_record([(("g", "t", 0), 5)]))
    damaged[-1] ^= 0xFF  # a record whose crc does not match is not read either
    entries, end = read_records(open(log, "rb").read() + bytes(damaged))
    assert entries[-1] == ("g", "t", 0, 4) and end == os.path.getsize(log)


def test_a_log_the_snapshot_does_not_name_is_stale_and_removed(tmp_path) -> None:
    """A crash between a new snapshot and the old log's removal leaves that log: its offsets are
    older than the snapshot's and must not be replayed over them."""
    store = _store(tmp_path)
    store.commit("g", "t", 0, 10)
    store.persist()
    store.close()
    generation = _generation(tmp_path)
    stale = log_path(str(tmp_path), generation - 1 if generation > 1 else generation + 7)
    with open(stale, "wb") as f:
        f.write(encode_record([(("g", "t", 0), 1), (("g", "old", 0), DELETED)]))
    assert _store(tmp_path).all() == {("g", "t", 0): 10}
    assert not os.path.exists(stale)


def test_an_older_stores_snapshot_is_read_and_its_first_persist_writes_one_naming_a_log(tmp_path) -> None:
    (tmp_path / OFFSETS).write_text(json.dumps({  # the layout a store wrote before the log
        "format": "equeue-offsets", "version": 1, "offsets": [["g", "t", 0, 5]], "meta": {}}))
    leftovers = [log_path(str(tmp_path), n) for n in (0, 1)]  # logs such a snapshot does not name (a downgrade, then back)
    for leftover in leftovers:
        with open(leftover, "wb") as f:
            f.write(encode_record([(("g", "t", 0), 1)]))
    store = _store(tmp_path)
    assert store.all() == {("g", "t", 0): 5} and not any(os.path.exists(p) for p in leftovers)
    store.commit("g", "t", 0, 6)
    store.persist()
    assert _generation(tmp_path) == 1 and _store(tmp_path).get("g", "t", 0) == 6


def test_a_failed_append_leaves_no_torn_record_and_the_next_persist_carries_its_offsets(tmp_path, monkeypatch) -> None:
    store = _store(tmp_path)
    store.commit("g", "t", 0, 1)
    store.persist()
    store.commit("g", "t", 0, 2)
    store.persist()
    log = log_path(str(tmp_path), _generation(tmp_path))
    size = os.path.getsize(log)
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected: fdatasync failed")

    store.commit("g", "t", 1, 7)
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError, match="injected"):
        store.persist()
    monkeypatch.setattr(os, "fdatasync", real)
    assert os.path.getsize(log) == size  # the failed record was cut off again
    store.commit("g", "t", 0, 3)  # newer than what failed: it must win
    store.persist()
    assert _store(tmp_path).all() == {("g", "t", 0): 3, ("g", "t", 1): 7}


def test_offsets_a_killed_broker_persisted_come_back(tmp_path) -> None:
    """A consumer commits, the broker persists on its interval (appending to the log), then dies
    by SIGKILL: the store opened again, as the next broker opens it, has the committed offsets."""
    data = tmp_path / "data"
    with BrokerProcess(data, env={"EQUEUE_OFFSET_PERSIST_MS": "200"}) as b:
        create_topic(b, "k", 2)
        with Producer(b.address) as p:
            for i in range(40):
                p.send(Message("k", b"m%d" % i))
        deadline = time.monotonic() + 10  # the broker's first persist writes a snapshot; later ones append
        while not (data / OFFSETS).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        handler = CountingHandler(40)
        c = Consumer("kg", b.address, consume_from="first")
        c.subscribe("k")
        c.start(handler)
        try:
            assert handler.done.wait(30)
        finally:
            c.close()  # commits what it handled
        deadline = time.monotonic() + 10  # until the broker's persist put them in the log
        while time.monotonic() < deadline:
            persisted = load_offsets(str(data)).offsets
            if sum(o for (g, _, _), o in persisted.items() if g == "kg") == 40:
                break
            time.sleep(0.05)
        b.kill()
    assert any(p.name.endswith(".log") for p in data.iterdir())
    offsets = _store(data).all()
    assert sum(o for (g, _, _), o in offsets.items() if g == "kg") == 40


def test_a_commit_does_not_wait_for_a_persists_append(tmp_path) -> None:
    """The log's write and fdatasync run outside the lock commits take: held open here, a commit
    finishes meanwhile."""
    store = _store(tmp_path)
    store.commit("g", "t", 0, 1)
    store.persist()  # the first persist writes a snapshot; the next one appends
    store.commit("g", "t", 0, 2)
    assert_commit_not_blocked_by_write(store, "_append", ("g", "t", 1), 5)
    store.persist()
    assert _store(tmp_path).all() == {("g", "t", 0): 2, ("g", "t", 1): 5}
