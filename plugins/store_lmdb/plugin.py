"""Registers the LMDB store: message store, queue index, offset store and reader, all named "lmdb"."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl

from .index import LmdbQueueIndex
from .offsets import LmdbOffsetStore
from .reader import LmdbStoreReader
from .store import LmdbMessageStore


@hookimpl
def equeue_message_stores() -> dict:
    return {"lmdb": LmdbMessageStore}


@hookimpl
def equeue_queue_indexes() -> dict:
    return {"lmdb": LmdbQueueIndex}


@hookimpl
def equeue_offset_stores() -> dict:
    return {"lmdb": LmdbOffsetStore}


@hookimpl
def equeue_store_readers() -> dict:
    return {"lmdb": LmdbStoreReader}
