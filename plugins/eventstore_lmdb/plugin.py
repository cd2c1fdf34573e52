"""Registers the LMDB event store under the name `lmdb`."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl


@hookimpl
def equeue_event_stores() -> dict:
    from equeue_plugins.eventstore_lmdb.store import LmdbEventStore

    return {"lmdb": LmdbEventStore}
