"""KVEngine: a key-value store's parts on one shared handle, opened and closed together.

The LMDB and RocksDB stores differ only in their primitives (how the shared handle is opened,
and the classes of their index, message store, offsets and metadata values over it); the order
of opening and closing, and what happens when opening fails half way, are the same and live here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from equeue_core.contracts import StoreSettings
from equeue_core.metadata import ScheduleInMeta, TopicsInMeta
from equeue_core.writer_lock import WriterLock


class KVEngine:
    """contracts.StoreEngine over a shared KV handle. The data directory's writer lock is taken
    before the handle is opened and held until close, so a second writer (another broker) gets
    StoreLockedError naming the holder whatever the engine's own locking allows."""

    def __init__(self, settings: StoreSettings, *, acquire: Callable[[str, dict], Any],
                 release: Callable[[Any], None], index: Callable[[Any], Any],
                 messages: Callable[[StoreSettings, Any, Any], Any], offsets: Callable[[Any], Any],
                 meta: Callable[[Any], Any]) -> None:
        self._lock = WriterLock.acquire(settings.data_dir)
        self._release_handle = release
        self._shared = None
        self.messages = None
        try:
            self._shared = acquire(settings.data_dir, settings.options)
            self.index = index(self._shared)
            self.messages = messages(settings, self._shared, self.index)
            self.recovery = self.messages.open()
            self.offsets = offsets(self._shared)
        except BaseException:
            self._release()
            raise
        self.replica_log = self.messages  # the message store is its own contracts.ReplicaLog
        values = meta(self._shared)
        self.topics = TopicsInMeta(values)
        self.schedule = ScheduleInMeta(values, self.offsets)
        self._closed = False

    def _release(self) -> None:
        try:
            if self.messages is not None:
                self.messages.close()
        finally:
            if self._shared is not None:
                self._release_handle(self._shared)
                self._shared = None
            self._lock.release()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.offsets.persist()
        finally:
            self._release()
