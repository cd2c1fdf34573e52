"""Projections: ordinary equeue consumers of the events topic, at least once, idempotent by event id.

An EventConsumer pulls EventStreams (one per handled command) with a clustering consumer, decodes
them and hands a batch of (event, meta) pairs to its Projection. Delivery is at least once (a
batch may come again after a crash or rebalance, and a duplicate command re-publishes its
events), so a projection applies each event id once: the default `claim` remembers ids in memory;
a durable read model claims them in the same transaction as its update (examples/bank does it in
SQLite). Events of one aggregate stay in one queue and the queue's batches run one at a time, so a
projection sees an aggregate's events in version order.
"""

from __future__ import annotations

from typing import Any

from equeue_cqrs.aggregate import handlers_of
from equeue_cqrs.messages import DomainEvent, EventMeta, decode, decode_streams
from equeue_cqrs.topics import ensure_topics

from equeue_core.client import Consumer, ReceivedMessage


def decode_events(msgs: list[ReceivedMessage]) -> list[tuple[DomainEvent, EventMeta]]:
    """The (event, meta) pairs of a batch of events-topic messages, in order."""
    out = []
    for m in msgs:
        for stream in decode_streams(m.body):
            for e in stream.events:
                out.append((decode(e.type, e.payload), EventMeta(stream.aggregate_id, stream.aggregate_type,
                                                                 e.version, e.event_id, stream.command_id,
                                                                 e.timestamp_ms)))
    return out


class Projection:
    """Base of projections and process managers: @event_handler methods `(self, event, meta)`;
    events without a handler are skipped."""

    def __init__(self) -> None:
        self._methods = handlers_of(type(self))
        self._seen: set[str] = set()

    def project(self, items: list[tuple[DomainEvent, EventMeta]]) -> None:
        for event, meta in items:
            if self.claim(meta.event_id):
                self.dispatch(event, meta)

    def claim(self, event_id: str) -> bool:
        """True the first time an event id is seen (in memory; override for a durable read model)."""
        if event_id in self._seen:
            return False
        self._seen.add(event_id)
        return True

    def handles(self, event: DomainEvent) -> bool:
        return type(event) in self._methods

    def dispatch(self, event: DomainEvent, meta: EventMeta) -> None:
        name = self._methods.get(type(event))
        if name is not None:
            getattr(self, name)(event, meta)


class EventConsumer:
    """Runs a Projection on the events topic in consumer group `group` (from the first event)."""

    def __init__(self, broker: str, group: str, projection: Projection, events_topic: str = "events",
                 batch: int = 64, **consumer_options: Any) -> None:
        options = {"consume_from": "first", "consume_batch_size": batch, "pull_batch": batch, **consumer_options}
        self.projection = projection
        self.broker = broker
        self.events_topic = events_topic
        self.consumer = Consumer(group, broker, **options).subscribe(events_topic)

    def start(self) -> EventConsumer:
        ensure_topics(self.broker, {self.events_topic: None})
        self.consumer.start(self._on_messages)
        return self

    def _on_messages(self, msgs: list[ReceivedMessage]) -> None:
        self.projection.project(decode_events(msgs))

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> EventConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
