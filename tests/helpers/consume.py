"""Collect messages with a real Consumer until a count is reached or time runs out."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from equeue_core.client import Consumer


class Collector:
    """A handler that records (topic, queue_id, queue_offset, body) and signals at `expected`.
    `stats`: the consumer's stats when `consume` closed it."""

    def __init__(self, expected: int, fail: Callable[[Any], bool] | None = None) -> None:
        self.expected = expected
        self.fail = fail
        self.stats: dict[str, Any] = {}
        self.items: list[tuple[str, int, int, bytes]] = []
        self.messages: list[Any] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, m: Any) -> None:
        if self.fail is not None and self.fail(m):
            raise RuntimeError(f"chosen failure {m.topic}/{m.queue_id}@{m.queue_offset}")
        with self.lock:
            self.items.append((m.topic, m.queue_id, m.queue_offset, m.body))
            self.messages.append(m)
            if len(self.items) >= self.expected:
                self.done.set()

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)


def consume(address: str, group: str, topic: str, expected: int, timeout: float = 60.0,
            collector: Collector | None = None, **options: Any) -> Collector:
    """Start a consumer, wait for `expected` messages (or timeout), close it (commits offsets).
    `collector`: the handler to use (a Collector of `expected` made here if None)."""
    col = Collector(expected) if collector is None else collector
    c = Consumer(group, address, **{"consume_from": "first", **options})
    c.subscribe(topic)
    c.start(col)
    try:
        deadline = time.monotonic() + timeout
        while not col.done.is_set() and time.monotonic() < deadline:
            col.done.wait(0.1)
    finally:
        col.stats = dict(c.stats)
        c.close()
    return col


def stored_bodies(address: str, topic: str, expected: int, timeout: float = 60.0) -> list[bytes]:
    """The topic's stored bodies (waiting for `expected` of them), queue by queue in offset order:
    what a test compares with the order it sent in."""
    col = consume(address, f"g-{topic}", topic, expected, timeout=timeout)
    return [body for _, _, _, body in sorted(col.items, key=lambda item: (item[1], item[2]))]
