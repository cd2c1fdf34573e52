"""Registers the rocksdb store: its engine (message store, queue index, offsets, metadata) and its
reader, both named "rocksdb"."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall


@hookimpl
def equeue_store_engines() -> dict:
    return {"rocksdb": ImportOnCall("equeue_plugins.store_rocksdb.engine:RocksEngine")}


@hookimpl
def equeue_store_readers() -> dict:
    return {"rocksdb": ImportOnCall("equeue_plugins.store_rocksdb.reader:RocksStoreReader")}
