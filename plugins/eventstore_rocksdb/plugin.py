"""Registers the RocksDB event store under the name `rocksdb`."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall


@hookimpl
def equeue_event_stores() -> dict:
    return {"rocksdb": ImportOnCall("equeue_plugins.eventstore_rocksdb.store:RocksdbEventStore")}
