"""Typed errors of the CQRS layer (EQueueError subclasses, so callers catch one family)."""

from __future__ import annotations

from equeue_core.errors import EQueueError


class EventStoreConflictError(EQueueError):
    """An event-store append refused because another writer got there first; nothing of the batch
    was written. `aggregate_id` names the aggregate whose command mailbox must be reset."""

    code = "cqrs_conflict"

    def __init__(self, message: str, aggregate_id: str, **details: object) -> None:
        super().__init__(message, aggregate_id=aggregate_id, **details)
        self.aggregate_id = aggregate_id


class VersionConflictError(EventStoreConflictError):
    """An event with this (aggregate id, version) is already stored."""

    code = "cqrs_version_conflict"

    def __init__(self, aggregate_id: str, version: int) -> None:
        super().__init__(f"aggregate {aggregate_id!r} already has version {version}", aggregate_id,
                         version=version)
        self.version = version


class DuplicateCommandError(EventStoreConflictError):
    """A command with this id already has a stored result."""

    code = "cqrs_duplicate_command"

    def __init__(self, command_id: str, aggregate_id: str) -> None:
        super().__init__(f"command {command_id!r} (aggregate {aggregate_id!r}) is already stored",
                         aggregate_id, command_id=command_id)
        self.command_id = command_id


class EventStoreError(EQueueError):
    """The event store cannot be opened or used (bad path, bad key, closed)."""

    code = "cqrs_event_store"


class UnknownTypeError(EQueueError):
    """A command or event type name that no registered class carries."""

    code = "cqrs_unknown_type"


class NoCommandHandlerError(EQueueError):
    """A command type without a @command_handler in the processor's handlers."""

    code = "cqrs_no_handler"


class CommandFailedError(EQueueError):
    """CommandBus.send: the command's handler failed; the message is the handler's error."""

    code = "cqrs_command_failed"


class CommandTimeoutError(EQueueError):
    """CommandBus.send: no result within the timeout (the command may still be handled later)."""

    code = "cqrs_command_timeout"
