"""Topic set-up: the processor, bus and event consumers create the topics they use before
consuming, so a consumer never starts on a topic that does not exist yet (it would pick the topic
up only at its next rebalance)."""

from __future__ import annotations

from equeue_core.client import AdminClient


def ensure_topics(broker: str, topics: dict[str, int | None]) -> dict[str, int]:
    """Create each missing topic (None: the broker's default queue count); existing ones are kept.
    Returns each topic's queue count."""
    counts = {}
    with AdminClient(broker) as admin:
        existing = admin.topics()
        for topic, queues in topics.items():
            if topic in existing:
                counts[topic] = existing[topic]["queues"]
            else:
                counts[topic] = admin.create_topic(topic, queues)
    return counts
