"""What only the LMDB and RocksDB stores have: their options and the clear errors at their limits.

Not part of the contract every store passes (those are the other test files); these pin the
behaviour docs/stores.md promises for the two key-value stores, when they are installed.
"""

from __future__ import annotations

import os

import pytest

from equeue_core.contracts import StoreSettings
from equeue_core.errors import ConfigError, EQueueError, StoreError
from equeue_core.plugins import get_plugin_manager
from tests.helpers.held_write import assert_commit_not_blocked_by_write

from .kit import append, check_message, make_batch, open_store, read_all, store_names

KV_STORES = [n for n in ("lmdb", "rocksdb") if n in store_names()]


def _settings(tmp_path, **options) -> StoreSettings:
    return StoreSettings(data_dir=str(tmp_path / "data"), options=options)


@pytest.mark.parametrize("name", KV_STORES)
def test_reader_of_a_directory_without_a_store_raises_store_error(name, tmp_path):
    os.makedirs(tmp_path / "empty")
    with pytest.raises(StoreError, match="no .* store at"):
        get_plugin_manager().store_reader(name)(str(tmp_path / "empty"), {})


@pytest.mark.parametrize("name", KV_STORES)
def test_tiny_chunks_keep_every_record_readable_and_retention_exact(name, tmp_path):
    """chunk_bytes smaller than a record: every record is a chunk of its own, so retention can
    cut at any record."""
    h = open_store(name, str(tmp_path / "data"), chunk_bytes=1)
    try:
        buf, starts = make_batch("t", 0, 0, 30)
        res = h.store.append("t", 0, buf, starts)
        for i, msg in enumerate(read_all(h.store, "t", 0, 0, 30)):
            check_message(msg, "t", 0, i)
        assert h.store.delete_before(res.positions[17]) > 0
        assert h.store.queue_range("t", 0) == (17, 30)
    finally:
        h.close()


def test_lmdb_full_map_is_a_store_error_naming_the_option(tmp_path):
    if "lmdb" not in store_names():
        pytest.fail("the lmdb store plugin is not installed")
    h = open_store("lmdb", str(tmp_path / "data"), map_size=1 << 20)
    store = h.store
    try:
        with pytest.raises(StoreError, match="map_size"):
            for first in range(0, 100_000, 500):
                buf, starts = make_batch("t", 0, first, 500)
                store.append("t", 0, buf, starts)
        # the failed append left nothing behind: what was stored is intact
        lo, hi = store.queue_range("t", 0)
        for i, msg in enumerate(read_all(store, "t", 0, lo, hi)):
            check_message(msg, "t", 0, i)
    finally:
        h.close()


def test_rocksdb_unknown_compression_is_a_config_error_listing_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="zstd"):
        get_plugin_manager().store_engine("rocksdb")(_settings(tmp_path, compression="brotli"))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_rocksdb_compression_choice_round_trips_records(compression, tmp_path):
    h = open_store("rocksdb", str(tmp_path / "data"), compression=compression)
    try:
        buf, starts = make_batch("t", 0, 0, 200)
        h.store.append("t", 0, buf, starts)
        for i, msg in enumerate(read_all(h.store, "t", 0, 0, 200)):
            check_message(msg, "t", 0, i)
    finally:
        h.close()


def test_rocksdb_read_only_reader_does_not_follow_live_writes(tmp_path):
    """The documented limit of mode=read_only (the default secondary mode follows: see
    test_processes). Opened while no primary is open in this process, it sees the store as it was."""
    data_dir = str(tmp_path / "data")
    h = open_store("rocksdb", data_dir)
    append(h, "t", 0, 10)
    h.close()
    reader = get_plugin_manager().store_reader("rocksdb")(data_dir, {"mode": "read_only"})
    try:
        h = open_store("rocksdb", data_dir)
        try:
            append(h, "t", 0, 5)
            h.store.flush()
            assert reader.queue_range("t", 0) == (0, 10)
        finally:
            h.close()
    finally:
        reader.close()


def test_rocksdb_unknown_reader_mode_is_a_config_error(tmp_path):
    data_dir = str(tmp_path / "data")
    open_store("rocksdb", data_dir).close()
    with pytest.raises(EQueueError, match="secondary"):
        get_plugin_manager().store_reader("rocksdb")(data_dir, {"mode": "follower"})


def _flip_a_body_byte(name: str, store, position: int) -> None:
    """Damage the stored record at position behind the store's back (a disk error, a bad copy)."""
    from equeue_core.kv import keys  # the key layout both engines share

    key = keys.log_key(position)
    if name == "lmdb":
        with store.env.begin(write=True) as txn:
            value = bytearray(txn.get(key, db=store.log_db))
            value[-1] ^= 0xFF
            txn.put(key, bytes(value), db=store.log_db)
    else:
        log = store.shared.view["log"]
        value = bytearray(log[key])
        value[-1] ^= 0xFF
        log[key] = bytes(value)


@pytest.mark.parametrize("name", KV_STORES)
def test_flipped_byte_in_a_stored_record_is_refused_not_served(name, tmp_path):
    from equeue_core.errors import CorruptRecordError

    data_dir = str(tmp_path / "data")
    h = open_store(name, data_dir)
    try:
        res = append(h, "t", 0, 1)  # one record: its chunk ends with its last body byte
        append(h, "t", 0, 3)
        _flip_a_body_byte(name, h.store, res.positions[0])
        with pytest.raises(CorruptRecordError):
            h.store.read_queue("t", 0, 0, 10, 1 << 20)
        with pytest.raises(CorruptRecordError):
            h.store.read_position(res.positions[0])
        assert h.store.read_queue("t", 0, 1, 10, 1 << 20).count == 3, "intact records stay readable"
        h.store.flush()
        reader = get_plugin_manager().store_reader(name)(data_dir, {})
        try:
            with pytest.raises(CorruptRecordError):
                list(reader.export("t", 0, 0, 4))
        finally:
            reader.close()
    finally:
        h.close()


def test_lmdb_writer_after_a_reader_in_the_same_process_is_a_store_error(tmp_path):
    data_dir = str(tmp_path / "data")
    open_store("lmdb", data_dir).close()
    reader = get_plugin_manager().store_reader("lmdb")(data_dir, {})
    try:
        with pytest.raises(StoreError, match="read-only"):
            open_store("lmdb", data_dir)
    finally:
        reader.close()
    open_store("lmdb", data_dir).close()  # and once the reader is closed, the writer opens


@pytest.mark.parametrize("name", KV_STORES)
def test_a_commit_does_not_wait_for_a_persists_durable_write(name, tmp_path):
    """The engine's durable write of a persist (a sync transaction, a synced WriteBatch) runs
    outside the lock commits take: held open here, a commit finishes meanwhile."""
    h = open_store(name, str(tmp_path / "data"))
    offsets = h.engine.offsets
    offsets.commit("g", "t", 0, 1)
    assert_commit_not_blocked_by_write(offsets, "_write_offsets", ("g", "t", 1), 2)
    offsets.persist()
    h.close()
    again = open_store(name, str(tmp_path / "data"))
    try:
        assert again.engine.offsets.all() == {("g", "t", 0): 1, ("g", "t", 1): 2}
    finally:
        again.close()
