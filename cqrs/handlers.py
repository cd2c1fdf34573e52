"""@command_handler functions and the context they get.

A command handler is `def deposit(ctx: CommandContext, command: Deposit) -> None`: it loads the
command's aggregate with ctx.get (or creates it with ctx.add) and calls its methods, which raise
events. Raising an exception fails the command (its message becomes the result); raise before
changing the aggregate when you can (a failure after raise_event costs a rebuild of the aggregate).
One command changes one aggregate, the one named by its aggregate_id: work across aggregates is a
process manager (see examples/bank).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar, overload

from equeue_cqrs.aggregate import Aggregate
from equeue_cqrs.messages import Command

from equeue_core.errors import ConfigError, EQueueError

A = TypeVar("A", bound=Aggregate)
Handler = Callable[["CommandContext", Any], None]


class AggregateNotFoundError(EQueueError):
    """ctx.get of an aggregate that has no events."""

    code = "cqrs_aggregate_not_found"


class AggregateExistsError(EQueueError):
    """ctx.add of an aggregate id that already has events."""

    code = "cqrs_aggregate_exists"


@overload
def command_handler(arg: Callable[..., Any]) -> Callable[..., Any]: ...
@overload
def command_handler(arg: type[Command]) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def command_handler(arg: Any) -> Any:
    """`@command_handler` (the command type comes from the annotation of the second parameter) or
    `@command_handler(Deposit)`."""
    if isinstance(arg, type) and issubclass(arg, Command):
        def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
            fn.__cqrs_command__ = arg  # type: ignore[attr-defined]
            return fn

        return mark
    fn = arg
    params = list(inspect.signature(fn).parameters)
    hints = typing.get_type_hints(fn)
    command_type = hints.get(params[1]) if len(params) >= 2 else None
    if not (isinstance(command_type, type) and issubclass(command_type, Command)):
        raise ConfigError(f"@command_handler {fn.__qualname__}: annotate its second parameter with a Command type")
    fn.__cqrs_command__ = command_type  # type: ignore[attr-defined]
    return fn


def handler_table(sources: Iterable[ModuleType | Callable[..., Any]]) -> dict[type, Handler]:
    """command type -> handler, from modules (every @command_handler in them) and functions."""
    table: dict[type, Handler] = {}
    for source in sources:
        members = vars(source).values() if isinstance(source, ModuleType) else [source]
        for fn in members:
            command_type = getattr(fn, "__cqrs_command__", None)
            if command_type is None:
                continue
            if command_type in table and table[command_type] is not fn:
                raise ConfigError(f"two @command_handler functions for {command_type.__name__}")
            table[command_type] = fn
    return table


class CommandContext:
    """What a handler sees: the aggregate of its command, loaded (from memory, else the store) on
    demand. Implemented by the command mailbox."""

    def __init__(self, command: Command, loader: Callable[[type, str], Aggregate | None],
                 exists: Callable[[str], bool]) -> None:
        self.command = command
        self._loader = loader
        self._exists = exists
        self.aggregate: Aggregate | None = None

    def get(self, aggregate_type: type[A], aggregate_id: str | None = None) -> A:
        aggregate_id = self._own(aggregate_id)
        agg = self._loader(aggregate_type, aggregate_id)
        if agg is None:
            raise AggregateNotFoundError(f"{aggregate_type.__name__} {aggregate_id!r} does not exist")
        if not isinstance(agg, aggregate_type):
            raise AggregateNotFoundError(f"{aggregate_id!r} is a {type(agg).__name__}, not a {aggregate_type.__name__}")
        self.aggregate = agg
        return agg

    def add(self, aggregate: A) -> A:
        self._own(aggregate.id)
        if self._exists(aggregate.id):
            raise AggregateExistsError(f"{type(aggregate).__name__} {aggregate.id!r} already exists")
        self.aggregate = aggregate
        return aggregate

    def _own(self, aggregate_id: str | None) -> str:
        own = self.command.aggregate_id
        if aggregate_id is not None and aggregate_id != own:
            raise ConfigError(f"command {type(self.command).__name__} targets {own!r} and may not change "
                              f"{aggregate_id!r}; use a process manager across aggregates")
        return own
