"""The kernel's hook specs: everything the kernel calls goes through one of these.

Each hook returns a mapping of name -> implementation, so one plugin can offer several and config
picks one by name (`store = "lmdb"`, `transport = "zmq"`, `allocation = "averagely"`). Built-in
plugins register through the same `equeue` entry-point group a third-party one uses.
docs/plugins.md documents each hook with an example; contracts.py defines what the objects must do.
"""

from __future__ import annotations

import pluggy

PROJECT = "equeue"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def equeue_store_engines() -> dict:
    """Store engines by name: name -> factory(StoreSettings) -> StoreEngine (opened, writer lock held)."""


@hookspec
def equeue_store_readers() -> dict:
    """Export readers by store name: name -> factory(path, options) -> StoreReader (another process)."""


@hookspec
def equeue_transports() -> dict:
    """Transports by name (the scheme of an address): name -> Transport."""


@hookspec
def equeue_allocation_strategies() -> dict:
    """Allocation strategies by name: name -> fn(consumer_id, queues, consumer_ids) -> list."""


@hookspec
def equeue_queue_selectors() -> dict:
    """Queue selectors by name: name -> factory() -> QueueSelector."""


@hookspec
def equeue_event_stores() -> dict:
    """Event stores (equeue_cqrs) by name: name -> factory(path, options) -> EventStore."""


@hookspec
def equeue_authorizers() -> dict:
    """Authorizers (docs/security.md) by name: name -> factory(Config) -> Authorizer."""
