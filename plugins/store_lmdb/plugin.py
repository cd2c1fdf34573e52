"""Registers the lmdb store: its engine (message store, queue index, offsets, metadata) and its
reader, both named "lmdb"."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl

from .engine import LmdbEngine
from .reader import LmdbStoreReader


@hookimpl
def equeue_store_engines() -> dict:
    return {"lmdb": LmdbEngine}


@hookimpl
def equeue_store_readers() -> dict:
    return {"lmdb": LmdbStoreReader}
