"""CQRS on EQueue, after ENode's mailbox design: see docs/cqrs.md.

Define commands, events and aggregates; write @command_handler functions; run a CommandProcessor
(or, without a broker, a CommandEngine); send with a CommandBus; project events with an
EventConsumer.
"""

from equeue_cqrs.aggregate import Aggregate, event_handler
from equeue_cqrs.bus import CommandBus
from equeue_cqrs.engine import CommandEngine
from equeue_cqrs.errors import (
    CommandFailedError,
    CommandTimeoutError,
    DuplicateCommandError,
    EventStoreConflictError,
    EventStoreError,
    VersionConflictError,
)
from equeue_cqrs.handlers import AggregateExistsError, AggregateNotFoundError, CommandContext, command_handler
from equeue_cqrs.messages import Command, CommandResult, DomainEvent, EventMeta
from equeue_cqrs.processor import CommandProcessor
from equeue_cqrs.projection import EventConsumer, Projection
from equeue_cqrs.store import EventStore, open_event_store

__all__ = ["Aggregate", "AggregateExistsError", "AggregateNotFoundError", "Command", "CommandBus",
           "CommandContext", "CommandEngine", "CommandProcessor", "EventConsumer", "Projection", "CommandFailedError", "CommandResult", "CommandTimeoutError", "DomainEvent",
           "DuplicateCommandError", "EventMeta", "EventStore", "EventStoreConflictError", "EventStoreError",
           "VersionConflictError", "command_handler", "event_handler", "open_event_store"]
