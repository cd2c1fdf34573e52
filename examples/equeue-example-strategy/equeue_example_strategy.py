"""A third-party EQueue plugin: one allocation strategy and one queue selector.

Installed with `pip install ./examples/equeue-example-strategy`, it is picked by name:
`Consumer(group, allocation="sticky_last")` and `AsyncProducer(selector="first_queue")`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue_core.hookspecs import hookimpl


def sticky_last(consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any]) -> list:
    """The newest member (last in sorted order) takes every queue; the others stand by.

    Useful when one hot standby should take over as a whole rather than share the load."""
    ids = sorted(set(consumer_ids))
    return sorted(queues) if ids and consumer_id == ids[-1] else []


class FirstQueue:
    """Sends everything to the lowest queue id: a single global order for a low-volume topic."""

    def select(self, queue_ids: Sequence[int], routing_key: str | None) -> int:
        return min(queue_ids)


@hookimpl
def equeue_allocation_strategies() -> dict:
    return {"sticky_last": sticky_last}


@hookimpl
def equeue_queue_selectors() -> dict:
    return {"first_queue": FirstQueue}
