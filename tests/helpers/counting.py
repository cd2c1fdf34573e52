"""A consumer handler that counts what it is handed and says when it has seen enough: the one
every drain measurement in bench/ (broker, cluster, queue-count and peers benchmarks) and the
tests that count deliveries use."""
from __future__ import annotations

import threading
from typing import Any


class CountingHandler:
    """Call it with each message (any thread); `done` is set once `count` were seen."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.seen = 0
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, _message: Any) -> None:
        with self._lock:
            self.seen += 1
            if self.seen >= self.count:
                self.done.set()
