"""Mailboxes over a worker pool: many mailboxes, each run by at most one worker at a time.

A mailbox is scheduled on the pool when something is posted to it and it is not already
scheduled; a worker takes up to `batch_size` items, hands them to `process`, and reschedules the
mailbox if more arrived (so a busy mailbox yields the worker to the others between runs). Because
one mailbox never runs on two workers at once, its items are processed in post order and its state
needs no lock of its own; different mailboxes run in parallel on the pool.
"""

from __future__ import annotations

import abc
import logging
import queue
import threading
from collections import deque
from typing import Any

log = logging.getLogger("equeue.cqrs")


class WorkerPool:
    """N threads running scheduled mailboxes. The GIL lets one run Python at a time, so a few
    threads are enough: they overlap event-store writes (fsync releases the GIL) with handling."""

    def __init__(self, workers: int = 4, name: str = "cqrs") -> None:
        self._ready: queue.SimpleQueue[Mailbox | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-worker-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def schedule(self, mailbox: Mailbox) -> None:
        self._ready.put(mailbox)

    def _work(self) -> None:
        while True:
            mailbox = self._ready.get()
            if mailbox is None:
                return
            try:
                mailbox.run()
            except Exception:  # a bug in a mailbox must not kill the worker serving the others
                log.exception("mailbox %s failed", mailbox)

    def close(self) -> None:
        for _ in self._threads:
            self._ready.put(None)
        for t in self._threads:
            t.join(10)


class Mailbox(abc.ABC):
    """Base class: subclasses implement `process(items)` (runs on a worker, never concurrently with
    itself) and may override `before_run()` for control work that must happen on the mailbox's turn."""

    def __init__(self, pool: WorkerPool, batch_size: int) -> None:
        self.pool = pool
        self.batch_size = batch_size
        self.items: deque[Any] = deque()
        self.lock = threading.Lock()
        self._scheduled = False
        self.paused = False

    def post(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
            self._schedule_locked()

    def post_many(self, items: list[Any], front: bool = False) -> None:
        with self.lock:
            if front:
                self.items.extendleft(reversed(items))
            else:
                self.items.extend(items)
            self._schedule_locked()

    def idle_locked(self) -> bool:
        """Nothing queued, nothing scheduled (call with self.lock held)."""
        return not self.items and not self._scheduled

    def wake(self) -> None:
        """Schedule a run even with nothing queued (for before_run's control work)."""
        with self.lock:
            self._schedule_locked(force=True)

    def _schedule_locked(self, force: bool = False) -> None:
        if not self._scheduled and (force or (self.items and not self.paused)):
            self._scheduled = True
            self.pool.schedule(self)

    def run(self) -> None:
        try:
            self.before_run()
            with self.lock:
                n = 0 if self.paused else min(self.batch_size, len(self.items))
                taken = [self.items.popleft() for _ in range(n)]
            if taken:
                self.process(taken)
        finally:
            with self.lock:
                self._scheduled = False
                self._schedule_locked(force=self.wants_run())

    def before_run(self) -> None:  # noqa: B027 - a hook subclasses may leave as it is
        """Control work done on the mailbox's own turn, before taking items (none by default)."""

    def wants_run(self) -> bool:
        """True when before_run has pending work even if no items are queued."""
        return False

    @abc.abstractmethod
    def process(self, items: list[Any]) -> None:
        """Handle a batch of queued items on the mailbox's turn (one worker at a time): the
        command mailbox runs handlers, the event mailbox persists and publishes."""
