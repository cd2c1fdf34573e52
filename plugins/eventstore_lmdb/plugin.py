"""Registers the LMDB event store under the name `lmdb`."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall


@hookimpl
def equeue_event_stores() -> dict:
    return {"lmdb": ImportOnCall("equeue_plugins.eventstore_lmdb.store:LmdbEventStore")}
