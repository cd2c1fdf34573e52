"""Commands, domain events and results, and how they travel: msgspec structs encoded as msgpack.

The structs are not tracked by the cyclic garbage collector (msgspec `gc=False`, inherited by
subclasses): one or more are made per command, and with thousands in flight the collector's scans
cost more than the work. Commands and events are plain data and must not hold reference cycles.

Every subclass of Command or DomainEvent is registered by its class name (its `type name`), which
is what the wire and the event store carry; a name must be unique within a process. A command
names the aggregate it targets (`aggregate_id`, also the routing key) and has an id that makes it
idempotent: a command id the event store has seen is answered from the stored result.
"""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Any, ClassVar

import msgspec
from equeue_cqrs.errors import UnknownTypeError

from equeue_core.errors import ConfigError

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
_types: dict[str, type] = {}
_decoders: dict[str, msgspec.msgpack.Decoder] = {}


def _register(cls: type) -> None:
    name = cls.__name__
    old = _types.get(name)
    if old is not None and old is not cls and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ConfigError(f"two message types are called {name!r}: {old.__module__} and {cls.__module__}")
    _types[name] = cls
    _decoders.pop(name, None)  # built on first decode: the class is not complete here yet


_id_prefix = uuid.uuid4().hex[:16]
_id_counter = itertools.count(1)


def _fresh_prefix() -> None:
    global _id_prefix
    _id_prefix = uuid.uuid4().hex[:16]


os.register_at_fork(after_in_child=_fresh_prefix)  # a forked child must not repeat the parent's ids


def new_id() -> str:
    """A unique id: a random per-process prefix and a counter (uuid4 per command costs a system
    call that releases the GIL, which under load costs far more than the call itself)."""
    return f"{_id_prefix}{next(_id_counter):x}"


class Command(msgspec.Struct, kw_only=True, gc=False):
    """Base of commands: `class Deposit(Command): amount: int`, sent as
    `Deposit(aggregate_id="acct-1", amount=5)`; command_id defaults to a fresh uuid."""

    aggregate_id: str
    command_id: str = msgspec.field(default_factory=new_id)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        _register(cls)


class DomainEvent(msgspec.Struct, kw_only=True, gc=False):
    """Base of domain events: `class Deposited(DomainEvent): amount: int`. An aggregate raises
    them; their place (aggregate id, version, event id) is kept beside them, not inside."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        _register(cls)


def type_name(obj: Any) -> str:
    return type(obj).__name__


def decode(name: str, payload: bytes | memoryview) -> Any:
    """The registered type called `name` decoded from msgpack."""
    decoder = _decoders.get(name)
    if decoder is None:
        cls = _types.get(name)
        if cls is None:
            raise UnknownTypeError(f"no command or event type called {name!r} is defined in this process")
        decoder = _decoders[name] = msgspec.msgpack.Decoder(cls)
    return decoder.decode(payload)


class CommandResult(msgspec.Struct, array_like=True, gc=False):
    """What a command came to: status "ok" (its events are persisted; version is the aggregate's
    version after them) or "failed" (message says why; nothing was persisted but the result)."""

    OK: ClassVar[str] = "ok"
    FAILED: ClassVar[str] = "failed"

    command_id: str
    aggregate_id: str
    status: str
    message: str = ""
    version: int = 0
    aggregate_type: str = ""

    @property
    def ok(self) -> bool:
        return self.status == CommandResult.OK


decode_result = msgspec.msgpack.Decoder(CommandResult).decode
decode_results = msgspec.msgpack.Decoder(list[CommandResult]).decode


class WireEvent(msgspec.Struct, array_like=True, gc=False):
    event_id: str
    version: int
    type: str
    payload: bytes
    timestamp_ms: int


class EventStream(msgspec.Struct, array_like=True, gc=False):
    """The events one command raised on one aggregate. A message on the events topic holds a
    msgpack list of them (all of aggregates that hash to that message's queue)."""

    aggregate_id: str
    aggregate_type: str
    command_id: str
    events: list[WireEvent]


decode_streams = msgspec.msgpack.Decoder(list[EventStream]).decode


class EventMeta(msgspec.Struct, frozen=True, gc=False):
    """Where a published event stands: projections are idempotent by event_id."""

    aggregate_id: str
    aggregate_type: str
    version: int
    event_id: str
    command_id: str
    timestamp_ms: int


def event_id(aggregate_id: str, version: int) -> str:
    """Event ids are (aggregate id, version), which the event store keeps unique."""
    return f"{aggregate_id}@{version}"
