"""Topic metadata: names, queue counts, persisted through the store engine's TopicDefinitions."""

from __future__ import annotations

import re
from collections.abc import Callable

from equeue_core.contracts import TopicDefinitions
from equeue_core.errors import InvalidTopicError, QueueNotFoundError, SystemTopicError, TopicNotFoundError

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.%-]{1,127}$")
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "%SCHEDULE%"  # messages waiting for a delay level (broker/schedule.py)
TIMER_TOPIC = "%TIMER%"  # messages waiting for an absolute deliver-at time: a ring of buckets
QUARANTINE_TOPIC = "%QUARANTINE%"  # records a system topic cannot use (malformed), kept for inspection
SYSTEM_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, SCHEDULE_TOPIC, TIMER_TOPIC, QUARANTINE_TOPIC)
MAX_QUEUES = 1024


def check_topic_name(topic: object, allow_system: bool = False) -> str:
    if not isinstance(topic, str) or not TOPIC_NAME.match(topic):
        raise InvalidTopicError(f"invalid topic name {topic!r}: use 1-127 characters of [A-Za-z0-9_.%-]")
    if not allow_system and topic.startswith(SYSTEM_PREFIXES):
        raise SystemTopicError(f"{topic!r} is a system topic: only the broker writes topics starting with "
                               f"{', '.join(SYSTEM_PREFIXES)}", topic=topic)
    return topic


def check_producer_topic(topic: object) -> str:
    """A topic a producer may send to: never a system topic, whether or not it exists yet (the
    broker writes those through its own paths: send-back, scheduler, dead letters)."""
    if isinstance(topic, str) and topic.startswith(SYSTEM_PREFIXES):
        raise SystemTopicError(f"{topic!r} is a system topic: producers may not send to it", topic=topic)
    return topic  # type: ignore[return-value]


class TopicRegistry:
    """name -> queue count. Changes are persisted before they are acknowledged."""

    def __init__(self, definitions: TopicDefinitions, default_queues: int, auto_create: bool) -> None:
        self._definitions = definitions
        self.default_queues = default_queues
        self.auto_create = auto_create
        self.topics: dict[str, int] = definitions.load()
        self.on_change: Callable[[], None] | None = None  # called after every saved change (cluster registrar)
        # called with (topic, queue count) after a user topic was created or given more queues
        # (not a system topic: %TIMER%'s ring has hundreds of queues written one by one over
        # hours, retry and dead-letter topics one queue each)
        self.on_grown: Callable[[str, int], None] | None = None

    def _save(self) -> None:
        self._definitions.save(self.topics)
        if self.on_change is not None:
            self.on_change()

    def create(self, topic: str, queues: int | None = None, system: bool = False) -> int:
        check_topic_name(topic, allow_system=system)
        n = self.default_queues if queues is None else int(queues)
        if not 1 <= n <= MAX_QUEUES:
            raise InvalidTopicError(f"queue count must be 1..{MAX_QUEUES}, not {n}")
        before = self.topics.get(topic, 0)
        if before != n:
            self.topics[topic] = max(n, before)
            self._save()
            if self.topics[topic] > before and self.on_grown is not None and not system:
                self.on_grown(topic, self.topics[topic])
        return self.topics[topic]

    def delete(self, topic: str) -> None:
        if self.topics.pop(topic, None) is not None:
            self._save()

    def queues(self, topic: str, create: bool = False, system: bool = False) -> int:
        n = self.topics.get(topic)
        if n is None:
            check_topic_name(topic, allow_system=system or topic.startswith(SYSTEM_PREFIXES))
            if create and (self.auto_create or system):
                return self.create(topic, 1 if system else None, system=system)
            raise TopicNotFoundError(f"topic {topic!r} does not exist", topic=topic)
        return n

    def check_queue(self, topic: str, queue_id: object) -> int:
        n = self.queues(topic)
        if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not 0 <= queue_id < n:
            raise QueueNotFoundError(f"topic {topic!r} has queues 0..{n - 1}, not {queue_id!r}",
                                     topic=topic, queue_id=queue_id)
        return queue_id
