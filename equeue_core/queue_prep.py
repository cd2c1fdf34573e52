"""A new topic's queue files, made before its first message and off the broker's loop thread.

A message store may offer `prepare_queues(topic, queue_ids)`: create what a queue's first append
would otherwise create (the file store: the queue's index directory and first index file), and
return how many queues it prepared. It is called on a thread of its own while the writer
appends, so it must only ever be a head start: never change what an append or a read sees, and
leave an append that comes first to create what it needs itself, as without it. A store without
it (the key-value stores: a queue's first entry is one more key) needs nothing.

Why: a queue's first append runs on the broker's loop thread, which every connection waits for,
and on a disk busy with the log's fsyncs creating a directory or a file waits for the file
system's journal: ~0.9 ms a queue, so a producer starting on 400 new queues stalled every client
~0.36 s (docs/benchmarks.md, "A queue's first write off the loop").
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class QueuePreparer:
    """Runs the store's `prepare_queues` for each topic given, one topic after another, on one
    thread started on first use. A failure is logged, never raised: the first append of each
    queue then creates its files as it would have anyway."""

    def __init__(self, store: Any) -> None:
        self._prepare = getattr(store, "prepare_queues", None)
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False

    def prepare(self, topic: str, queues: int) -> None:
        """Prepare queues 0..queues-1 of `topic` in the background (those already there are
        skipped by the store)."""
        if self._prepare is None or self._closed:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="equeue-queue-prep")
        self._executor.submit(self._run, topic, queues)

    def _run(self, topic: str, queues: int) -> None:
        try:
            self._prepare(topic, range(queues))
        except Exception as e:  # a head start only: the first append creates what is missing
            log.warning("preparing the queue files of %s ahead of its first messages failed: %s", topic, e)

    def close(self) -> None:
        """Stop: topics not begun yet are dropped, the one in progress finishes (before the store
        closes)."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
