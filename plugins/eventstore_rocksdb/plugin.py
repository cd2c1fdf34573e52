"""Registers the RocksDB event store under the name `rocksdb`."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl


@hookimpl
def equeue_event_stores() -> dict:
    from equeue_plugins.eventstore_rocksdb.store import RocksdbEventStore

    return {"rocksdb": RocksdbEventStore}
