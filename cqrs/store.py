"""The event store contract every `equeue_event_stores` plugin implements, and how to open one.

An event store keeps, per aggregate, its events keyed by (aggregate id, version), plus two small
tables: command id -> the command's stored result (dedup) and aggregate id -> latest snapshot.
`append` writes one EventBatch atomically: all of it or (on a conflict) none of it. That single
atomic write per batch is what lets the event mailbox persist many commands' events at once and
still detect a second writer: a stored (aggregate id, version) or command id raises a typed
EventStoreConflictError naming the aggregate. tests/conformance/event_stores/ is the contract
in executable form.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from equeue_cqrs.errors import EventStoreError

MAX_ID_BYTES = 255


# Not frozen: a frozen dataclass builds itself through object.__setattr__, several times slower,
# and one of these is made per event. Treat them as values all the same.
@dataclass(slots=True)
class StoredEvent:
    """One persisted event: (aggregate_id, version) is unique; event_id is unique too."""

    aggregate_id: str
    version: int
    command_id: str
    event_id: str
    type: str
    payload: bytes
    timestamp_ms: int


@dataclass(slots=True)
class CommandRecord:
    """A handled command: the versions its events got (0, 0 when it raised none) and its result."""

    command_id: str
    aggregate_id: str
    first_version: int
    last_version: int
    result: bytes


@dataclass(slots=True)
class Snapshot:
    """An aggregate's encoded state as of `version` (its events up to and including it)."""

    aggregate_id: str
    version: int
    state: bytes


@dataclass(slots=True)
class EventBatch:
    """What one append writes atomically."""

    events: list[StoredEvent] = field(default_factory=list)
    commands: list[CommandRecord] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)


@runtime_checkable
class EventStore(Protocol):
    def append(self, batch: EventBatch) -> None:
        """Write the batch atomically and durably (unless opened with sync=false). A stored or
        repeated (aggregate id, version) raises VersionConflictError, a stored or repeated command
        id DuplicateCommandError; either way nothing of the batch is written."""

    def read_events(self, aggregate_id: str, from_version: int = 1,
                    to_version: int | None = None) -> list[StoredEvent]:
        """The aggregate's events with from_version <= version (<= to_version), in version order."""

    def command_results(self, command_ids: Iterable[str]) -> dict[str, CommandRecord]:
        """The stored records of those command ids that have one (one read for many ids)."""

    def load_snapshot(self, aggregate_id: str) -> Snapshot | None:
        """The latest snapshot of the aggregate, if any."""

    def iter_events(self) -> Iterator[StoredEvent]:
        """Every stored event, ordered by (aggregate id, version) (for audits and rebuilds)."""

    def close(self) -> None: ...


def check_id(kind: str, value: str) -> bytes:
    """An id as key bytes: non-empty UTF-8 of at most MAX_ID_BYTES without NUL (the key separator)."""
    raw = value.encode()
    if not raw or len(raw) > MAX_ID_BYTES or b"\x00" in raw:
        raise EventStoreError(f"{kind} {value!r} must be 1-{MAX_ID_BYTES} bytes of UTF-8 without NUL")
    return raw


def check_batch(batch: EventBatch) -> None:
    """Conflicts inside the batch itself (the same version or command id twice) are conflicts too."""
    from equeue_cqrs.errors import DuplicateCommandError, VersionConflictError

    seen: set[tuple[str, int]] = set()
    for e in batch.events:
        key = (e.aggregate_id, e.version)
        if key in seen:
            raise VersionConflictError(e.aggregate_id, e.version)
        seen.add(key)
    ids: set[str] = set()
    for c in batch.commands:
        if c.command_id in ids:
            raise DuplicateCommandError(c.command_id, c.aggregate_id)
        ids.add(c.command_id)


def event_store_names() -> list[str]:
    from equeue_core.plugins import get_plugin_manager

    return get_plugin_manager().names("equeue_event_stores")


def open_event_store(name: str, path: str, options: dict[str, str] | None = None) -> EventStore:
    """The event store plugin called `name`, opened on `path` (an unknown name lists the installed)."""
    from equeue_core.plugins import get_plugin_manager

    return get_plugin_manager().event_store(name)(path, dict(options or {}))
