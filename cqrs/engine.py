"""The command engine: command mailboxes, event mailboxes and the event store, without a broker.

- submit(command) routes it by aggregate id to that aggregate's CommandMailbox. The mailbox runs
  on one worker at a time, keeps the aggregate in memory, runs the @command_handler and hands the
  outcome (events, result, maybe a snapshot) to the EventMailbox chosen by the same aggregate id,
  then goes on to the next command at once: it never waits for persistence.
- An EventMailbox persists the outcomes it has in one EventStore.append (one write per batch), and
  only then reports them persisted (the CommandProcessor publishes their events and lets their
  command offsets commit; in process, the command is done).
- A conflict at append (another process wrote that aggregate version, or the command id) resets
  that aggregate's command mailbox: its epoch is bumped so outcomes computed from the stale state
  are dropped, and on its next turn it moves every handled-but-unpersisted command back to the
  front of its queue, forgets the aggregate (the next command reloads it from the store, from a
  snapshot when there is one) and resumes. The rest of the batch is appended again without it.
- A command id with a stored result is answered from it and never handled again; a command id
  already in flight here is answered with the first one's result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from equeue_cqrs.aggregate import Aggregate
from equeue_cqrs.errors import EventStoreConflictError, NoCommandHandlerError
from equeue_cqrs.handlers import CommandContext, handler_table
from equeue_cqrs.mailbox import Mailbox, WorkerPool
from equeue_cqrs.messages import Command, CommandResult, DomainEvent, decode, decode_result, encode, event_id
from equeue_cqrs.store import CommandRecord, EventBatch, EventStore, Snapshot, StoredEvent

from equeue_core.errors import EQueueError

log = logging.getLogger("equeue.cqrs")
Done = Callable[[CommandResult], None]


@dataclass(slots=True, eq=False)
class PendingCommand:
    command: Command
    on_done: Done
    followers: list[Done] | None = None  # later arrivals of the same command id


class Outcome:
    """A handled command on its way to the event store (a plain slotted class: one is made per
    command, and a dataclass with a default factory costs twice as much to build)."""

    __slots__ = ("pending", "mailbox", "epoch", "seq", "aggregate_type", "events", "result", "snapshot",
                 "stored")

    def __init__(self, pending: PendingCommand, mailbox: CommandMailbox, epoch: int, seq: int,
                 aggregate_type: str, events: list[tuple[int, DomainEvent]], result: CommandResult,
                 snapshot: Snapshot | None) -> None:
        self.pending = pending
        self.mailbox = mailbox
        self.epoch = epoch
        self.seq = seq
        self.aggregate_type = aggregate_type
        self.events = events
        self.result = result
        self.snapshot = snapshot
        self.stored: list[StoredEvent] = []

    @property
    def command_id(self) -> str:
        return self.pending.command.command_id


class CommandMailbox(Mailbox):
    """One aggregate's commands, handled in order, one at a time, the aggregate kept in memory."""

    def __init__(self, engine: CommandEngine, aggregate_id: str) -> None:
        super().__init__(engine.pool, engine.command_batch)
        self.engine = engine
        self.aggregate_id = aggregate_id
        self.aggregate: Aggregate | None = None
        self.epoch = 0
        self.reset_requested = False
        self.inflight: dict[int, Outcome] = {}  # handled, not yet persisted, in handling order
        self._handled: list[Outcome] = []  # handled in the current run, not yet in inflight
        self._seq = 0
        self._ctx = CommandContext(Command(aggregate_id=aggregate_id), self._load, self._exists)
        self.event_mailbox = engine.event_mailbox_of(aggregate_id)
        self.last_active = time.monotonic()

    def __repr__(self) -> str:
        return f"CommandMailbox({self.aggregate_id!r})"

    # -- conflict reset --------------------------------------------------------------------------

    def request_reset(self) -> None:
        """Called by the event mailbox on a conflict: pause; the reset runs on this mailbox's turn."""
        with self.lock:
            self.epoch += 1
            self.reset_requested = True
            self.paused = True
            self._schedule_locked(force=True)

    def wants_run(self) -> bool:
        return self.reset_requested

    def before_run(self) -> None:
        if not self.reset_requested:
            return
        with self.lock:
            back = [o.pending for o in self.inflight.values()]
            self.inflight.clear()
            self.items.extendleft(reversed(back))
            self.aggregate = None
            self.reset_requested = False
            self.paused = False
        self.engine.stats["resets"] += 1
        log.info("aggregate %s changed elsewhere: reloading it and handling %d command(s) again",
                 self.aggregate_id, len(back))

    # -- handling --------------------------------------------------------------------------------

    def evictable_locked(self, idle_since: float) -> bool:
        """Idle and holding nothing unfinished since before idle_since (call with self.lock held)."""
        return (self.idle_locked() and not self.inflight and not self.reset_requested
                and self.last_active < idle_since)

    def process(self, items: list[PendingCommand]) -> None:
        engine = self.engine
        self.last_active = time.monotonic()
        # A mailbox that holds its aggregate has seen every command of it so far; one that has
        # just (re)loaded asks the store which commands are done already. A duplicate that slips
        # past (a command redelivered to a warm mailbox) is caught by the store's command-id check
        # at append and comes back here through a reset, with the mailbox cold.
        try:
            stored = {} if self.aggregate is not None else engine.store.command_results(
                [p.command.command_id for p in items])
        except EQueueError as e:  # the store is unreadable for now: keep the commands, try again
            log.warning("event store read failed (%s); %s retries in 0.1s", e, self)
            with self.lock:
                self.items.extendleft(reversed(items))
            time.sleep(0.1)
            return
        handled = self._handled = []
        try:
            for i, p in enumerate(items):
                if self.reset_requested:  # a conflict arrived mid-run: the rest waits for the reset
                    with self.lock:
                        self.items.extendleft(reversed(items[i:]))
                    return
                record = stored.get(p.command.command_id) if stored else None
                if record is not None:
                    engine.answer_duplicate(p, record)
                    continue
                handled.append(self._handle(p))
        finally:
            # One lock round and one post for the run's outcomes; the reset that may follow runs
            # on this mailbox's next turn, so it sees all of them in inflight.
            self._handled = []
            if handled:
                with self.lock:
                    for o in handled:
                        self.inflight[o.seq] = o
                self.event_mailbox.post_many(handled)

    def _handle(self, p: PendingCommand) -> Outcome:
        engine = self.engine
        command = p.command
        epoch = self.epoch
        ctx = self._ctx
        ctx.command, ctx.aggregate = command, None
        try:
            engine.handlers[type(command)](ctx, command)
            failure = None
        except Exception as e:
            failure = f"{type(e).__name__}: {e}"
        agg = ctx.aggregate
        if failure is not None:
            if agg is not None and agg.has_uncommitted():
                agg.take_uncommitted()
                if agg is self.aggregate:
                    self._rebuild()
            return self._outcome(p, epoch, "", [], CommandResult(
                command.command_id, command.aggregate_id, CommandResult.FAILED, failure,
                self.aggregate.version if self.aggregate else 0), None)
        if agg is None:
            return self._outcome(p, epoch, "", [], CommandResult(
                command.command_id, command.aggregate_id, CommandResult.OK, "", 0), None)
        self.aggregate = agg
        events = agg.take_uncommitted()
        snapshot = None
        every = engine.snapshot_every
        if events and every and events[-1][0] // every > (events[0][0] - 1) // every:
            snapshot = Snapshot(agg.id, agg.version, agg.snapshot_state())
        return self._outcome(p, epoch, type(agg).__name__, events, CommandResult(
            command.command_id, command.aggregate_id, CommandResult.OK, "", agg.version, type(agg).__name__),
            snapshot)

    def _outcome(self, p: PendingCommand, epoch: int, aggregate_type: str, events: list,
                 result: CommandResult, snapshot: Snapshot | None) -> Outcome:
        self._seq += 1
        return Outcome(p, self, epoch, self._seq, aggregate_type, events, result, snapshot)

    def _load(self, aggregate_type: type, aggregate_id: str) -> Aggregate | None:
        if self.aggregate is None:
            self.aggregate = self.engine.load(aggregate_type, aggregate_id)
        return self.aggregate

    def _exists(self, aggregate_id: str) -> bool:
        store = self.engine.store
        return (self.aggregate is not None or bool(store.read_events(aggregate_id, 1, 1))
                or store.load_snapshot(aggregate_id) is not None)

    def _rebuild(self) -> None:
        """After a handler failed half-way: the stored state plus the events still in flight.
        In-flight events are taken first and filtered by version, so an outcome persisted between
        the two reads is applied once."""
        assert self.aggregate is not None
        with self.lock:
            pending = [o for o in (*self.inflight.values(), *self._handled) if o.epoch == self.epoch]
        agg = self.engine.load(type(self.aggregate), self.aggregate_id)
        if agg is None:
            agg = type(self.aggregate).empty(self.aggregate_id)
        for o in pending:
            for version, event in o.events:
                if version > agg.version:
                    agg.apply(event)
                    agg.version = version
        self.aggregate = agg if agg.version else None


class EventMailbox(Mailbox):
    """Persists outcomes in batches: one EventStore.append per run, then reports them persisted."""

    def __init__(self, engine: CommandEngine, index: int) -> None:
        super().__init__(engine.pool, engine.event_batch)
        self.engine = engine
        self.index = index

    def __repr__(self) -> str:
        return f"EventMailbox({self.index})"

    def process(self, items: list[Outcome]) -> None:
        engine = self.engine
        live = [o for o in items if o.epoch == o.mailbox.epoch]
        backoff = 0.05
        while live:
            try:
                engine.store.append(self._batch(live))
                break
            except EventStoreConflictError as e:
                engine.stats["conflicts"] += 1
                mailbox = next((o.mailbox for o in live if o.mailbox.aggregate_id == e.aggregate_id), None)
                if mailbox is None:  # cannot happen: the store names an aggregate of the batch
                    raise
                mailbox.request_reset()
                live = [o for o in live if o.mailbox is not mailbox]
            except EQueueError as e:
                if engine.closed:
                    return  # not persisted: the commands stay unacknowledged and come back
                log.warning("event store append failed (%s); retrying in %.2fs", e, backoff)
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)
        if live:
            engine.persisted(live)

    @staticmethod
    def _batch(outcomes: list[Outcome]) -> EventBatch:
        now = time.time_ns() // 1_000_000
        batch = EventBatch()
        events, commands, snapshots = batch.events, batch.commands, batch.snapshots
        for o in outcomes:
            agg_id = o.mailbox.aggregate_id
            cid = o.command_id
            o.stored = [StoredEvent(agg_id, v, cid, event_id(agg_id, v), type(e).__name__, encode(e), now)
                        for v, e in o.events]
            events.extend(o.stored)
            first, last = (o.events[0][0], o.events[-1][0]) if o.events else (0, 0)
            commands.append(CommandRecord(cid, agg_id, first, last, encode(o.result)))
            if o.snapshot is not None:
                snapshots.append(o.snapshot)
        return batch


class CommandEngine:
    """Mailboxes plus an event store. `on_persisted(outcomes, complete)` (the processor's publish
    step) is called after each successful append and must call `complete(outcomes)` when done;
    `on_duplicate(pending, record, result, complete)` likewise for a command answered from the
    store. Without them, persisted means done."""

    def __init__(self, store: EventStore, handlers: Iterable[ModuleType | Callable[..., Any]], *,
                 workers: int = 2, event_mailboxes: int = 4, command_batch: int = 64,
                 event_batch: int = 1000, snapshot_every: int = 100, max_idle_seconds: float = 600.0,
                 on_persisted: Callable[[list[Outcome], Callable[[list[Outcome]], None]], None] | None = None,
                 on_duplicate: Callable[..., None] | None = None) -> None:
        self.store = store
        self.handlers = handler_table(handlers)
        self.command_batch = command_batch
        self.event_batch = event_batch
        self.snapshot_every = snapshot_every
        self.max_idle_seconds = max_idle_seconds
        self._next_sweep = time.monotonic() + max_idle_seconds / 2
        self.on_persisted = on_persisted
        self.on_duplicate = on_duplicate
        self.pool = WorkerPool(workers)
        self.event_mailboxes = [EventMailbox(self, i) for i in range(event_mailboxes)]
        self.mailboxes: dict[str, CommandMailbox] = {}
        self._lock = threading.Lock()
        self._inflight: dict[str, PendingCommand] = {}
        self._idle = threading.Condition(self._lock)
        self.closed = False
        self.stats = {"handled": 0, "duplicates": 0, "conflicts": 0, "resets": 0, "evicted": 0}

    def submit(self, command: Command, on_done: Done) -> None:
        """Queue a command; on_done(result) runs (on a worker thread) once its events are
        persisted and published, or at once for a duplicate / unknown command."""
        self.submit_many([(command, on_done)])

    def submit_many(self, commands: Iterable[tuple[Command, Done]]) -> None:
        """submit() for many commands at once: one lock round and one post per mailbox."""
        posts: dict[CommandMailbox, list[PendingCommand]] = {}
        unknown: list[PendingCommand] = []
        handlers = self.handlers
        with self._lock:
            inflight, mailboxes = self._inflight, self.mailboxes
            for command, on_done in commands:
                cid = command.command_id
                first = inflight.get(cid)
                if first is not None:
                    if first.followers is None:
                        first.followers = []
                    first.followers.append(on_done)
                    continue
                p = inflight[cid] = PendingCommand(command, on_done)
                if type(command) not in handlers:
                    unknown.append(p)
                    continue
                mailbox = mailboxes.get(command.aggregate_id)
                if mailbox is None:
                    mailbox = mailboxes[command.aggregate_id] = CommandMailbox(self, command.aggregate_id)
                posted = posts.get(mailbox)
                if posted is None:
                    posts[mailbox] = [p]
                else:
                    posted.append(p)
            # Posting under the engine lock: an idle-mailbox sweep (which holds this lock) can then
            # never drop a mailbox between looking it up and posting to it, which would leave two
            # mailboxes, and two concurrent handlers, for one aggregate.
            for mailbox, pendings in posts.items():
                mailbox.post_many(pendings)
            if time.monotonic() >= self._next_sweep:
                self._sweep_locked()
        for p in unknown:
            self.complete_one(p, CommandResult(p.command.command_id, p.command.aggregate_id, CommandResult.FAILED,
                                               str(NoCommandHandlerError(
                                                   f"no @command_handler for {type(p.command).__name__}"))))

    def _sweep_locked(self) -> None:
        """Forget the mailboxes (and so the aggregates) idle for max_idle_seconds, as ENode's
        aggregate memory cache expires: memory stays bounded by the recently active aggregates,
        and one that comes back is reloaded from the store (from its snapshot)."""
        now = time.monotonic()
        self._next_sweep = now + max(0.05, self.max_idle_seconds / 2)
        idle_since = now - self.max_idle_seconds
        for aggregate_id, mailbox in list(self.mailboxes.items()):
            with mailbox.lock:
                if mailbox.evictable_locked(idle_since):
                    del self.mailboxes[aggregate_id]
                    self.stats["evicted"] += 1

    def event_mailbox_of(self, aggregate_id: str) -> EventMailbox:
        """An aggregate's outcomes always go to the same event mailbox, so they persist in order."""
        return self.event_mailboxes[hash(aggregate_id) % len(self.event_mailboxes)]

    def load(self, aggregate_type: type, aggregate_id: str) -> Aggregate | None:
        """The aggregate rebuilt from the store: its snapshot if any, then the events after it."""
        snapshot = self.store.load_snapshot(aggregate_id)
        agg = aggregate_type.empty(aggregate_id)
        if snapshot is not None:
            agg.restore_state(snapshot.state)
            agg.version = snapshot.version
        for e in self.store.read_events(aggregate_id, agg.version + 1):
            agg.apply(decode(e.type, e.payload))
            agg.version = e.version
        return agg if agg.version else None

    def persisted(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            with o.mailbox.lock:
                o.mailbox.inflight.pop(o.seq, None)
        self.stats["handled"] += len(outcomes)
        if self.on_persisted is None:
            self.complete(outcomes)
        else:
            self.on_persisted(outcomes, self.complete)

    def answer_duplicate(self, p: PendingCommand, record: CommandRecord) -> None:
        self.stats["duplicates"] += 1
        result = decode_result(record.result)
        if self.on_duplicate is None:
            self.complete_one(p, result)
        else:
            self.on_duplicate(p, record, result, self.complete_one)

    def complete(self, outcomes: list[Outcome]) -> None:
        with self._lock:
            pop = self._inflight.pop
            for o in outcomes:
                pop(o.pending.command.command_id, None)
            if not self._inflight:
                self._idle.notify_all()
        for o in outcomes:
            self._call(o.pending, o.result)

    def complete_one(self, p: PendingCommand, result: CommandResult) -> None:
        with self._lock:
            self._inflight.pop(p.command.command_id, None)
            if not self._inflight:
                self._idle.notify_all()
        self._call(p, result)

    @staticmethod
    def _call(p: PendingCommand, result: CommandResult) -> None:
        try:
            p.on_done(result)
            for done in p.followers or ():
                done(result)
        except Exception:
            log.exception("command completion callback failed")

    def in_flight(self) -> int:
        return len(self._inflight)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every submitted command is done; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        self.closed = True
        self.pool.close()
