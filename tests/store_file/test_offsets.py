"""The offsets file: atomic replacement, groups isolated. Metadata values: files of their own,
durable at once, read from the offsets file of an older store until their first write."""

from __future__ import annotations

import base64
import json
import os

import pytest
from equeue_plugins.store_file.constants import META_DIR, OFFSETS
from equeue_plugins.store_file.offsets import FileMeta, FileOffsetStore
from equeue_plugins.store_file.reader import FileStoreReader

from equeue_core.client import AdminClient
from equeue_core.contracts import StoreSettings
from equeue_core.errors import StoreError
from tests.helpers.broker import BrokerProcess


def test_offsets_atomic_persist(tmp_path) -> None:
    s = StoreSettings(str(tmp_path))
    offsets = FileOffsetStore(s)
    offsets.commit("g1", "t", 0, 10)
    offsets.commit("g2", "t", 0, 3)
    offsets.persist()
    before = (tmp_path / OFFSETS).read_bytes()
    offsets.commit("g1", "t", 0, 99)
    # a crash while persisting leaves at most a temp file next to the old one: never a mix
    (tmp_path / f"{OFFSETS}.tmp.1.2").write_bytes(b'{"format": "equeue-offs')
    assert (tmp_path / OFFSETS).read_bytes() == before
    again = FileOffsetStore(s)
    assert again.get("g1", "t", 0) == 10 and again.get("g2", "t", 0) == 3
    offsets.persist()
    assert FileOffsetStore(s).get("g1", "t", 0) == 99
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(OFFSETS + ".tmp.") and p.name != f"{OFFSETS}.tmp.1.2"]


def test_offsets_groups_are_isolated_and_deletable(tmp_path) -> None:
    offsets = FileOffsetStore(StoreSettings(str(tmp_path)))
    offsets.commit("g1", "t", 0, 5)
    offsets.commit("g1", "t", 1, 6)
    offsets.commit("g2", "t", 0, 7)
    assert offsets.all() == {("g1", "t", 0): 5, ("g1", "t", 1): 6, ("g2", "t", 0): 7}
    offsets.delete_group("g1")
    assert offsets.get("g1", "t", 0) is None and offsets.get("g2", "t", 0) == 7
    offsets.close()
    assert FileOffsetStore(StoreSettings(str(tmp_path))).all() == {("g2", "t", 0): 7}
    assert FileStoreReader(str(tmp_path), {}).group_offsets() == {("g2", "t", 0): 7}


def test_a_metadata_value_is_durable_when_written_and_never_rewrites_the_offsets_file(tmp_path) -> None:
    offsets = FileOffsetStore(StoreSettings(str(tmp_path)))
    for q in range(1000):
        offsets.commit("g", "t", q, q)
    offsets.persist()
    inode = os.stat(tmp_path / OFFSETS).st_ino
    meta = FileMeta(offsets, str(tmp_path))
    meta.write("topics", b"\x00\x01binary")
    meta.write("schedule_progress", b"{}")
    # before, each write replaced the offsets file with every committed offset in it
    assert os.stat(tmp_path / OFFSETS).st_ino == inode
    again = FileMeta(FileOffsetStore(StoreSettings(str(tmp_path))), str(tmp_path))  # a restart
    assert again.read("topics") == b"\x00\x01binary" and again.read("schedule_progress") == b"{}"
    assert again.read("missing") is None
    assert sorted(os.listdir(tmp_path / META_DIR)) == ["schedule_progress", "topics"]
    with pytest.raises(StoreError, match="file name"):
        meta.write("../offsets.json", b"x")


def test_metadata_of_an_older_store_is_read_from_the_offsets_file_until_its_first_write(tmp_path) -> None:
    old_topics = json.dumps({"orders": 8}).encode()
    (tmp_path / OFFSETS).write_text(json.dumps({  # the layout a store wrote before meta/ existed
        "format": "equeue-offsets", "version": 1, "offsets": [["g", "orders", 0, 5]],
        "meta": {"topics": base64.b64encode(old_topics).decode()}}))
    offsets = FileOffsetStore(StoreSettings(str(tmp_path)))
    meta = FileMeta(offsets, str(tmp_path))
    assert meta.read("topics") == old_topics
    meta.write("topics", b'{"orders": 8, "new": 4}')
    offsets.persist()  # the offsets file stops carrying the moved value
    doc = json.loads((tmp_path / OFFSETS).read_text())
    assert doc["meta"] == {} and doc["offsets"] == [["g", "orders", 0, 5]]
    again = FileMeta(FileOffsetStore(StoreSettings(str(tmp_path))), str(tmp_path))
    assert again.read("topics") == b'{"orders": 8, "new": 4}'


def test_damaged_offsets_file_is_a_clear_error(tmp_path) -> None:
    (tmp_path / OFFSETS).write_text(json.dumps({"format": "something else", "version": 1}))
    with pytest.raises(StoreError):
        FileOffsetStore(StoreSettings(str(tmp_path)))
    (tmp_path / OFFSETS).write_text("{not json")
    with pytest.raises(StoreError):
        FileOffsetStore(StoreSettings(str(tmp_path)))


def test_the_broker_creates_topics_without_rewriting_committed_offsets_and_keeps_them_past_a_kill(tmp_path) -> None:
    """With 20k committed offsets the offsets file is ~450 KB; a topic's creation wrote all of it
    (with an fsync) on the broker's loop thread. Now it writes meta/topics only, durably: a kill
    -9 right after the answer keeps the topic."""
    from equeue_plugins.store_file.engine import FileEngine

    data = tmp_path / "data"
    engine = FileEngine(StoreSettings(str(data)))
    for g in range(40):
        for q in range(500):
            engine.offsets.commit(f"group-{g}", "t", q, q + 1)
    engine.close()
    inode = os.stat(data / OFFSETS).st_ino
    b = BrokerProcess(data).start()
    try:
        with AdminClient(b.address) as admin:
            for i in range(5):
                admin.create_topic(f"new-{i}", 3)
        assert os.stat(data / OFFSETS).st_ino == inode  # not rewritten
    finally:
        b.kill()
    with BrokerProcess(data) as b, AdminClient(b.address) as admin:
        topics = admin.topics()
        assert all(topics[f"new-{i}"]["queues"] == 3 for i in range(5)), topics
    offsets = FileOffsetStore(StoreSettings(str(data))).all()
    assert len(offsets) == 20_000 and offsets[("group-7", "t", 499)] == 500
