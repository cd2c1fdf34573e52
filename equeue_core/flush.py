"""Flushing off the event loop, with group commit: a helper every store plugin can use.

The store's writer appends and calls `written(end)`. A flusher thread makes the data durable by
calling the store's `flush_fn` (fsync, msync, sync txn commit ...), which returns the end position
it made durable. In "sync" mode the thread flushes as soon as anyone waits, so concurrent senders
share one fsync (group commit); in "async" mode it flushes every interval and `wait` resolves at the
next flush. The event loop never runs an fsync.

A failed flush is not permanent: the waiters it could not serve get a StoreError naming the cause
(disk full, I/O error), and the next wait or interval tries again, so once space is freed sync
sends work again without a restart. While it keeps failing every sync send fails at once with that
error (no hanging). `failures` counts failed flushes; a store that keeps a checkpoint must not let
one vouch for data a failed flush covered (FileMessageStore caps it, see its _flush_to_disk).

Waking the thread is a raw lock used as a doorbell (released by `wait`, taken by the thread), not
a threading.Condition: a flush=sync single send pays one wake-up per request, and a Condition's
Python-level notify/wait (a new lock per wait, its own mutex) cost more broker CPU than the send.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from equeue_core.errors import EQueueError, StoreError

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
        self._lock = threading.Lock()  # guards _waiters and _stopping
        self._bell = threading.Lock()  # held while nobody rang: the thread blocks taking it
        self._bell.acquire()
        self._waiters: list[tuple[int, int, concurrent.futures.Future]] = []
        self._seq = itertools.count()
        self._written = 0
        self.flushed = 0
        self._stopping = False
        self.last_error: BaseException | None = None  # the most recent failure (kept for reports)
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, flushed: int = 0) -> None:
        self.flushed = self._written = flushed
        self._thread.start()

    def written(self, end_position: int) -> None:
        """The writer has appended up to end_position (not yet durable)."""
        self._written = end_position

    def wait(self, end_position: int) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if end_position <= self.flushed:
            fut.set_result(None)
            return fut
        with self._lock:
            heapq.heappush(self._waiters, (end_position, next(self._seq), fut))
        if self.mode == "sync":
            self._ring()
        return fut

    def _ring(self) -> None:
        """Wake the thread (or make its next wait return at once)."""
        try:
            self._bell.release()
        except RuntimeError:
            pass  # rung already and not yet answered: the thread wakes anyway

    def _run(self) -> None:
        while True:
            if not self._stopping and not (self.mode == "sync" and self._waiters):
                self._bell.acquire(timeout=self.interval if self.mode == "async" else -1)
            stopping = self._stopping
            if self._written > self.flushed or self._waiters:
                self._flush_once()
            if stopping:
                return

    def _flush_once(self) -> None:
        with self._lock:  # the waiters this attempt answers: any later one gets a fresh try
            attempt = self._waiters
            self._waiters = []
        try:
            started = time.perf_counter()
            flushed = self._flush_fn()
        except BaseException as e:  # disk errors must reach every waiter, not kill the thread
            self.failures += 1
            if self.failures == 1 or str(e) != str(self.last_error):
                log.error("flush failed (%d so far): %s; waiting sends fail, the next flush retries",
                          self.failures, e)
            self.last_error = e
            err = e if isinstance(e, EQueueError) else StoreError(f"flush to disk failed: {e}")
            for _, _, fut in attempt:
                if not fut.done():
                    fut.set_exception(err)
            return
        elapsed = time.perf_counter() - started
        if self.last_error is not None:
            log.warning("flush works again after %d failures", self.failures)
            self.last_error = None
        self.flushed = max(self.flushed, flushed)
        done = []
        with self._lock:
            for item in attempt:
                heapq.heappush(self._waiters, item)
            while self._waiters and self._waiters[0][0] <= self.flushed:
                done.append(heapq.heappop(self._waiters)[2])
        # The timing first, the waiters last: what a resolved waiter wakes (the broker's loop
        # thread) needs the GIL this thread holds until it blocks again, so resolving them as
        # the last thing before blocking makes the sync send wait least.
        for observe in _flush_observers:
            observe(elapsed)
        for fut in done:
            if not fut.done():
                fut.set_result(None)

    def stop(self) -> None:
        """Flush what is written, resolve waiters, and end the thread."""
        with self._lock:
            self._stopping = True
        self._ring()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._flush_once()
