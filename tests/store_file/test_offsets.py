"""The offsets file: atomic replacement, metadata persisted at once, groups isolated."""

from __future__ import annotations

import json

import pytest
from equeue_plugins.store_file.constants import OFFSETS
from equeue_plugins.store_file.offsets import FileOffsetStore
from equeue_plugins.store_file.reader import FileStoreReader

from equeue_core.contracts import StoreSettings
from equeue_core.errors import StoreError


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


def test_put_meta_is_persisted_before_returning(tmp_path) -> None:
    offsets = FileOffsetStore(StoreSettings(str(tmp_path)))
    offsets.put_meta("topics", b"\x00\x01binary")
    other = FileOffsetStore(StoreSettings(str(tmp_path)))  # as a restarted broker would see it
    assert other.get_meta("topics") == b"\x00\x01binary"
    assert other.get_meta("missing") is None


def test_damaged_offsets_file_is_a_clear_error(tmp_path) -> None:
    (tmp_path / OFFSETS).write_text(json.dumps({"format": "something else", "version": 1}))
    with pytest.raises(StoreError):
        FileOffsetStore(StoreSettings(str(tmp_path)))
    (tmp_path / OFFSETS).write_text("{not json")
    with pytest.raises(StoreError):
        FileOffsetStore(StoreSettings(str(tmp_path)))
