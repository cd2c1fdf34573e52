"""A small domain for the CQRS tests: a log aggregate whose state is the list of numbers appended
to it (so order and duplicates are visible) and their running total."""

from __future__ import annotations

from equeue_cqrs import Aggregate, Command, CommandContext, DomainEvent, command_handler, event_handler


class StartLog(Command):
    pass


class AppendNumber(Command):
    n: int


class FailAfterRaising(Command):
    n: int


class LogStarted(DomainEvent):
    pass


class NumberAppended(DomainEvent):
    n: int


class NumberLog(Aggregate):
    numbers: list[int] = []
    total = 0

    @classmethod
    def start(cls, aggregate_id: str) -> NumberLog:
        log = cls(aggregate_id)
        log.raise_event(LogStarted())
        return log

    def append(self, n: int) -> None:
        self.raise_event(NumberAppended(n))

    @event_handler(LogStarted)
    def _started(self, e: LogStarted) -> None:
        self.numbers = []
        self.total = 0

    @event_handler(NumberAppended)
    def _appended(self, e: NumberAppended) -> None:
        self.numbers = [*self.numbers, e.n]
        self.total += e.n


@command_handler
def start_log(ctx: CommandContext, command: StartLog) -> None:
    ctx.add(NumberLog.start(command.aggregate_id))


@command_handler
def append_number(ctx: CommandContext, command: AppendNumber) -> None:
    ctx.get(NumberLog).append(command.n)


@command_handler
def fail_after_raising(ctx: CommandContext, command: FailAfterRaising) -> None:
    ctx.get(NumberLog).append(command.n)
    raise ValueError("changed my mind")
