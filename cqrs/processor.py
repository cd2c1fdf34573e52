"""CommandProcessor: the engine fed by an ordinary equeue consumer, publishing to an events topic.

Consumption: a clustering Consumer of the commands topic (group `group`) whose handler is async
and takes a pulled batch: it decodes the commands, submits them to the engine (which routes each
to its aggregate's mailbox) and returns only when every one of them is done, i.e. its events are
persisted AND published (and its reply sent). Until then the consumer keeps those offsets in its
window, so an offset commits only after the command's events are durable; after a crash the
commands come back and the event store's command-id check answers them from the stored result.

Why not the orderly consumer: it runs one batch per queue at a time, so a queue would wait for an
event-store write per batch. The concurrent consumer with `parallel_per_queue` batches in flight
keeps the mailboxes fed; order per aggregate still holds because a queue's batches reach the
handler in offset order (the consumer starts them in order, and the handler hands every command to
its mailbox before its first await) and one aggregate's commands are all in one queue (the bus
routes by aggregate id through the hash selector). Several processors in one group split the
queues through the group's allocation; while a queue moves between them both may briefly handle
an aggregate, which the event store's version check turns into a conflict and a reset.

Publication: the event streams of one persisted batch (one EventStream per handled command with
events) are grouped by the events-topic queue their aggregate id hashes to (the producer's `hash`
selector, so one aggregate's events always land in one queue, in order) and each group goes out
as one message whose body is a msgpack list of EventStreams and whose routing key is one of its
aggregate ids. One message per queue per batch instead of one per command is what keeps the
client and broker cost per command small. A duplicate command re-publishes its stored events (the first run may have died between
persisting and publishing): projections must be idempotent by event id, and are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from equeue_cqrs.engine import CommandEngine, Outcome, PendingCommand
from equeue_cqrs.messages import CommandResult, EventStream, WireEvent, decode, encode
from equeue_cqrs.store import CommandRecord, EventStore
from equeue_cqrs.topics import ensure_topics

from equeue_core.client import Consumer, Message, Producer, ReceivedMessage
from equeue_core.errors import EQueueError
from equeue_core.plugins import get_plugin_manager

log = logging.getLogger("equeue.cqrs")
REPLY_TO = "reply_to"
RESULT_TAG = "result"
EVENTS_TAG = "events"
MAX_STREAMS_PER_MESSAGE = 2000


class CommandProcessor:
    """Consumes `commands_topic`, handles through a CommandEngine on `store`, publishes to
    `events_topic`. start() returns at once; close() drains, commits and stops."""

    def __init__(self, broker: str, store: EventStore, handlers: Iterable[ModuleType | Callable[..., Any]], *,
                 commands_topic: str = "commands", events_topic: str = "events",
                 group: str = "cqrs-processor", workers: int = 2, event_mailboxes: int = 4,
                 command_batch: int = 64, event_batch: int = 1000, snapshot_every: int = 100,
                 max_idle_seconds: float = 600.0, pull_batch: int = 64, batches_in_flight_per_queue: int = 64,
                 consumer_options: dict[str, Any] | None = None) -> None:
        self.broker = broker
        self.store = store
        self.commands_topic = commands_topic
        self.events_topic = events_topic
        self.engine = CommandEngine(store, handlers, workers=workers, event_mailboxes=event_mailboxes,
                                    command_batch=command_batch, event_batch=event_batch,
                                    snapshot_every=snapshot_every, max_idle_seconds=max_idle_seconds,
                                    on_persisted=self._publish,
                                    on_duplicate=self._republish)
        options = {"consume_batch_size": pull_batch, "pull_batch": pull_batch,
                   "parallel_per_queue": batches_in_flight_per_queue,
                   "flow_max_messages": pull_batch * batches_in_flight_per_queue,
                   "flow_max_span": pull_batch * batches_in_flight_per_queue * 2,
                   "consume_from": "first", **(consumer_options or {})}
        self.producer = Producer(broker)
        self.consumer = Consumer(group, broker, **options)
        self._waiters = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="cqrs-publish")
        self._hash = get_plugin_manager().queue_selector("hash")()
        self._event_queues: list[int] = [0]
        self._closed = False

    def start(self) -> CommandProcessor:
        counts = ensure_topics(self.broker, {self.commands_topic: None, self.events_topic: None})
        self._event_queues = list(range(counts[self.events_topic]))
        self.producer.start()
        self.consumer.subscribe(self.commands_topic).start(self._on_commands)
        return self

    @property
    def stats(self) -> dict[str, int]:
        return self.engine.stats

    # -- the consumer's handler (runs on the client loop) -----------------------------------------

    async def _on_commands(self, msgs: list[ReceivedMessage]) -> None:
        """Submit a pulled batch and return once all of it is done. The results for each reply
        topic go back as one message per batch (a list of CommandResults), not one per command."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        left = [len(msgs)]
        replies: dict[str, list[CommandResult]] = {}
        lock = threading.Lock()

        def done(reply_to: str | None, result: CommandResult | None) -> None:
            with lock:
                if reply_to and result is not None:
                    replies.setdefault(reply_to, []).append(result)
                left[0] -= 1
                last = left[0] == 0
            if last:
                if replies:  # off this thread: it may be the client loop, where sends must not block
                    self._waiters.submit(self._send_replies, replies)
                loop.call_soon_threadsafe(_resolve, finished)

        commands = []
        callbacks: dict[str | None, Callable[[CommandResult], None]] = {}  # one per reply topic
        for m in msgs:
            try:
                command = decode(m.tag or "", m.body)
            except (EQueueError, ValueError) as e:  # undecodable: retrying cannot help, so consume it
                log.warning("dropping command %s on %s/%d@%d: %s", m.msg_id, m.topic, m.queue_id,
                            m.queue_offset, e)
                done(None, None)
                continue
            reply_to = m.properties.get(REPLY_TO)
            callback = callbacks.get(reply_to)
            if callback is None:
                callback = callbacks[reply_to] = lambda result, reply_to=reply_to: done(reply_to, result)
            commands.append((command, callback))
        self.engine.submit_many(commands)
        await finished

    def _send_replies(self, replies: dict[str, list[CommandResult]]) -> None:
        for reply_to, results in replies.items():
            try:
                self.producer.send_async(Message(reply_to, encode(results), tag=RESULT_TAG))
            except EQueueError as e:  # the sender times out; the commands themselves are done
                log.warning("%d results for %s not sent: %s", len(results), reply_to, e)

    # -- publishing (engine callbacks, on worker threads) -----------------------------------------

    def _publish(self, outcomes: list[Outcome], complete: Callable[[list[Outcome]], None]) -> None:
        streams = [EventStream(o.mailbox.aggregate_id, o.aggregate_type, o.command_id,
                               [WireEvent(e.event_id, e.version, e.type, e.payload, e.timestamp_ms) for e in o.stored])
                   for o in outcomes if o.stored]
        self._send_then(self._event_messages(streams), lambda: complete(outcomes))

    def _republish(self, p: PendingCommand, record: CommandRecord, result: CommandResult,
                   complete_one: Callable[[PendingCommand, CommandResult], None]) -> None:
        streams = []
        if record.last_version:
            try:
                events = self.store.read_events(record.aggregate_id, record.first_version, record.last_version)
            except EQueueError as e:  # answer anyway: the first run published them unless it died
                log.warning("events of duplicate command %s not re-published: %s", record.command_id, e)
                events = []
            if events:
                streams.append(EventStream(record.aggregate_id, result.aggregate_type, record.command_id,
                                           [WireEvent(e.event_id, e.version, e.type, e.payload, e.timestamp_ms)
                                            for e in events]))
        self._send_then(self._event_messages(streams), lambda: complete_one(p, result))

    def _event_messages(self, streams: list[EventStream]) -> list[tuple[Message, str]]:
        """(message, routing key) per events-topic queue: the streams whose aggregates hash there."""
        groups: dict[int, list[EventStream]] = {}
        select, queues = self._hash.select, self._event_queues
        for stream in streams:
            groups.setdefault(select(queues, stream.aggregate_id), []).append(stream)
        out = []
        for group in groups.values():
            for i in range(0, len(group), MAX_STREAMS_PER_MESSAGE):
                part = group[i:i + MAX_STREAMS_PER_MESSAGE]
                out.append((Message(self.events_topic, encode(part), tag=EVENTS_TAG), part[0].aggregate_id))
        return out

    def _send_then(self, messages: list[tuple[Message, str]], then: Callable[[], None]) -> None:
        """Send the event messages, then (on a publisher thread, once the broker has them all) run
        `then`. A failed send is retried until it succeeds or the processor closes; after close the
        commands stay unacknowledged and come back to whoever owns their queue next."""
        if not messages:
            then()
            return
        futures = [self.producer.send_async(m, routing_key=key) for m, key in messages]
        self._waiters.submit(self._await_sent, messages, futures, then)

    def _await_sent(self, messages: list[tuple[Message, str]], futures: list[Any],
                    then: Callable[[], None]) -> None:
        backoff = 0.1
        while True:
            failed = []
            for m, f in zip(messages, futures, strict=True):
                try:
                    f.result(60)
                except Exception as e:
                    failed.append(m)
                    error = e
            if not failed:
                then()
                return
            if self._closed:
                log.warning("%d event messages not published before close: %s", len(failed), error)
                return
            log.warning("publishing %d event messages failed (%s); retrying", len(failed), error)
            time.sleep(backoff)
            backoff = min(2.0, backoff * 2)
            messages = failed
            futures = [self.producer.send_async(m, routing_key=key) for m, key in failed]

    # -- shutdown -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop consuming (in-flight commands finish first, then offsets commit), then stop."""
        if self._closed:
            return
        try:
            self.consumer.close()
        finally:
            self._closed = True
            self.engine.close()
            self._waiters.shutdown(wait=True, cancel_futures=False)
            self.producer.close()


    def __enter__(self) -> CommandProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
