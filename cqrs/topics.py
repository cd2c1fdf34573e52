"""Topic set-up: the processor, bus and event consumers create the topics they use before
consuming, so a consumer never starts on a topic that does not exist yet (it would pick the topic
up only at its next rebalance)."""

from __future__ import annotations

from equeue_core.client import AdminClient


def ensure_topics(broker: str, topics: dict[str, int | None]) -> None:
    """Create each missing topic (None: the broker's default queue count); existing ones are kept."""
    with AdminClient(broker) as admin:
        existing = admin.topics()
        for topic, queues in topics.items():
            if topic not in existing:
                admin.create_topic(topic, queues)
