"""Registers the RocksDB store: message store, queue index, offset store and reader, all named "rocksdb"."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl

from .index import RocksQueueIndex
from .offsets import RocksOffsetStore
from .reader import RocksStoreReader
from .store import RocksMessageStore


@hookimpl
def equeue_message_stores() -> dict:
    return {"rocksdb": RocksMessageStore}


@hookimpl
def equeue_queue_indexes() -> dict:
    return {"rocksdb": RocksQueueIndex}


@hookimpl
def equeue_offset_stores() -> dict:
    return {"rocksdb": RocksOffsetStore}


@hookimpl
def equeue_store_readers() -> dict:
    return {"rocksdb": RocksStoreReader}
