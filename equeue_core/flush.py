"""Flushing off the event loop, with group commit: a helper every store plugin can use.

The store's writer appends and calls `written(end)`. A flusher thread makes the data durable by
calling the store's `flush_fn` (fsync, msync, sync txn commit ...), which returns the end position
it made durable. In "sync" mode the thread flushes as soon as anyone waits, so concurrent senders
share one fsync (group commit); in "async" mode it flushes every interval and `wait` resolves at the
next flush. The event loop never runs an fsync.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

_flush_observers: list[Callable[[float], None]] = []


def observe_flushes(fn: Callable[[float], None]) -> Callable[[], None]:
    """Call fn(seconds) after every flush round of every Flusher in this process (the broker's
    metrics time the store's fsyncs this way, whatever the store plugin). Returns a remover."""
    _flush_observers.append(fn)
    return lambda: _flush_observers.remove(fn)


class Flusher:
    def __init__(self, flush_fn: Callable[[], int], mode: str = "async", interval_ms: int = 500,
                 name: str = "equeue-flusher") -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"flush mode must be 'async' or 'sync', not {mode!r}")
        self._flush_fn = flush_fn
        self.mode = mode
        self.interval = interval_ms / 1000.0
        self._cond = threading.Condition()
        self._waiters: list[tuple[int, int, concurrent.futures.Future]] = []
        self._seq = itertools.count()
        self._written = 0
        self.flushed = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, flushed: int = 0) -> None:
        self.flushed = self._written = flushed
        self._thread.start()

    def written(self, end_position: int) -> None:
        """The writer has appended up to end_position (not yet durable)."""
        self._written = end_position

    def wait(self, end_position: int) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._error is not None:
            fut.set_exception(self._error)
            return fut
        if end_position <= self.flushed:
            fut.set_result(None)
            return fut
        with self._cond:
            heapq.heappush(self._waiters, (end_position, next(self._seq), fut))
            if self.mode == "sync":
                self._cond.notify()
        return fut

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and not (self.mode == "sync" and self._waiters):
                    self._cond.wait(self.interval if self.mode == "async" or not self._waiters else None)
                stopping = self._stopping
            if self._written > self.flushed or self._waiters:
                self._flush_once()
            if stopping:
                return

    def _flush_once(self) -> None:
        try:
            started = time.perf_counter()
            flushed = self._flush_fn()
        except BaseException as e:  # disk errors must reach every waiter, not kill silently
            log.exception("flush failed")
            self._error = e
            with self._cond:
                waiters, self._waiters = self._waiters, []
            for _, _, fut in waiters:
                if not fut.done():
                    fut.set_exception(e)
            return
        elapsed = time.perf_counter() - started
        self.flushed = max(self.flushed, flushed)
        done = []
        with self._cond:
            while self._waiters and self._waiters[0][0] <= self.flushed:
                done.append(heapq.heappop(self._waiters)[2])
        for fut in done:
            if not fut.done():
                fut.set_result(None)
        for observe in _flush_observers:  # after the waiters: timing never delays a sync send
            observe(elapsed)

    def stop(self) -> None:
        """Flush what is written, resolve waiters, and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._flush_once()
