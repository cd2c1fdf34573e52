"""`allocate(strategy, consumer_id, queues, consumer_ids)`: any installed strategy, by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue_core.plugins import get_plugin_manager


def allocate(strategy: str, consumer_id: Any, queues: Sequence[Any], consumer_ids: Sequence[Any]) -> list:
    """The queues `consumer_id` takes when `consumer_ids` share `queues` under `strategy`."""
    fn = get_plugin_manager().allocation_strategy(strategy)
    return list(fn(consumer_id, list(queues), list(consumer_ids)))
