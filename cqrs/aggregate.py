"""Aggregates: in-memory state changed only by applying events, with a version per event.

`raise_event(e)` applies e through the @event_handler method for its type, bumps the version and
remembers e as uncommitted; the command processor takes the uncommitted events after a command
and persists them. Replaying stored events (from a snapshot when there is one) rebuilds the same
state, so handlers must be deterministic and must not fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import msgspec
from equeue_cqrs.messages import DomainEvent

F = TypeVar("F", bound=Callable[..., Any])
_snapshot_encode = msgspec.msgpack.Encoder().encode
_snapshot_decode = msgspec.msgpack.Decoder().decode


def event_handler(event_type: type[DomainEvent]) -> Callable[[F], F]:
    """Mark a method as the handler of one event type: on an Aggregate it is `(self, event)` and
    changes state; on a Projection it is `(self, event, meta)`."""

    def mark(fn: F) -> F:
        fn.__cqrs_event__ = event_type  # type: ignore[attr-defined]
        return fn

    return mark


def handlers_of(cls: type) -> dict[type, str]:
    """event type -> method name, for every @event_handler method of cls and its bases."""
    found: dict[type, str] = {}
    for klass in reversed(cls.__mro__):
        for name, member in vars(klass).items():
            event_type = getattr(member, "__cqrs_event__", None)
            if event_type is not None:
                found[event_type] = name
    return found


class Aggregate:
    """Base of aggregates. Subclasses give state defaults as class attributes (immutable ones: a
    list or dict default would be shared, so create those in the first event's handler), change
    state only in @event_handler methods, and decide in command methods that call raise_event().
    Snapshots hold the public attributes, so those must be msgpack-able (ints, strs, lists, dicts)."""

    _event_methods: ClassVar[dict[type, str]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls._event_methods = handlers_of(cls)

    def __init__(self, aggregate_id: str) -> None:
        self.id = aggregate_id
        self.version = 0
        self._uncommitted: list[tuple[int, DomainEvent]] = []

    def apply(self, event: DomainEvent) -> None:
        """Change state by one event (replay and raise_event both come here)."""
        name = self._event_methods.get(type(event))
        if name is None:
            raise TypeError(f"{type(self).__name__} has no @event_handler for {type(event).__name__}")
        getattr(self, name)(event)

    def raise_event(self, event: DomainEvent) -> None:
        self.apply(event)
        self.version += 1
        self._uncommitted.append((self.version, event))

    def take_uncommitted(self) -> list[tuple[int, DomainEvent]]:
        out, self._uncommitted = self._uncommitted, []
        return out

    def has_uncommitted(self) -> bool:
        return bool(self._uncommitted)

    # -- snapshots: the public attributes other than id and version, as msgpack ----------------

    def snapshot_state(self) -> bytes:
        return _snapshot_encode({k: v for k, v in vars(self).items()
                                 if not k.startswith("_") and k not in ("id", "version")})

    def restore_state(self, state: bytes) -> None:
        vars(self).update(_snapshot_decode(state))

    @classmethod
    def empty(cls, aggregate_id: str) -> Aggregate:
        """An instance with no events applied (what replay starts from)."""
        obj = cls.__new__(cls)
        Aggregate.__init__(obj, aggregate_id)
        return obj
