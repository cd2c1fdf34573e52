"""AnswerWindow: wait for send_async answers in windows, so a producer benchmark keeps a bounded
number of futures (and their batches) alive, and knows every message was acknowledged at the end."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future


class AnswerWindow:
    def __init__(self, size: int = 20_000) -> None:
        self.size = size
        self._futures: list[Future] = []

    def add(self, future: Future) -> None:
        self._futures.append(future)
        if len(self._futures) >= self.size:
            self.drain()

    def extend(self, futures: Iterable[Future]) -> None:
        for f in futures:
            self.add(f)

    def drain(self) -> None:
        """Wait for every answer still outstanding (raises the first send's error)."""
        for f in self._futures:
            f.result()
        self._futures.clear()
