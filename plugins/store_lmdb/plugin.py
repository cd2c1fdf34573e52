"""Registers the lmdb store: its engine (message store, queue index, offsets, metadata) and its
reader, both named "lmdb"."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall


@hookimpl
def equeue_store_engines() -> dict:
    return {"lmdb": ImportOnCall("equeue_plugins.store_lmdb.engine:LmdbEngine")}


@hookimpl
def equeue_store_readers() -> dict:
    return {"lmdb": ImportOnCall("equeue_plugins.store_lmdb.reader:LmdbStoreReader")}
