"""Registers the rocksdb store: its engine (message store, queue index, offsets, metadata) and its
reader, both named "rocksdb"."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl

from .engine import RocksEngine
from .reader import RocksStoreReader


@hookimpl
def equeue_store_engines() -> dict:
    return {"rocksdb": RocksEngine}


@hookimpl
def equeue_store_readers() -> dict:
    return {"rocksdb": RocksStoreReader}
