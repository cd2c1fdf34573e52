"""Built-in allocation strategies and queue selectors, registered like any third-party plugin."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl
from equeue_core.strategies import allocation, selectors


@hookimpl
def equeue_allocation_strategies() -> dict:
    return {
        "averagely": allocation.averagely,
        "averagely_by_circle": allocation.averagely_by_circle,
        "consistent_hash": allocation.consistent_hash,
    }


@hookimpl
def equeue_queue_selectors() -> dict:
    return {
        "round_robin": selectors.RoundRobin,
        "hash": selectors.Hash,
        "random": selectors.Random,
    }
