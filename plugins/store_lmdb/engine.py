"""LmdbEngine: the LMDB store's parts on one environment, opened and closed together."""

from __future__ import annotations

from equeue_core.contracts import StoreSettings
from equeue_core.metadata import ScheduleInMeta, TopicsInMeta
from equeue_core.writer_lock import WriterLock

from . import environment
from .index import LmdbQueueIndex
from .offsets import LmdbMeta, LmdbOffsetStore
from .store import LmdbMessageStore


class LmdbEngine:
    """contracts.StoreEngine. LMDB lets several processes write one environment (its lock file
    only serializes their transactions), but two brokers would each keep their own next position
    and queue ranges and overwrite each other's records: so the data directory's writer lock is
    taken before the environment is opened, and held until close."""

    def __init__(self, settings: StoreSettings) -> None:
        self._lock = WriterLock.acquire(settings.data_dir)
        self._shared = None
        self.messages = None
        try:
            self._shared = environment.acquire(settings.data_dir, settings.options)
            self.index = LmdbQueueIndex(self._shared)
            self.messages = LmdbMessageStore(settings, self._shared, self.index)
            self.recovery = self.messages.open()
            self.offsets = LmdbOffsetStore(self._shared)
        except BaseException:
            self._release()
            raise
        meta = LmdbMeta(self._shared)
        self.topics = TopicsInMeta(meta)
        self.schedule = ScheduleInMeta(meta, self.offsets)
        self._closed = False

    def _release(self) -> None:
        try:
            if self.messages is not None:
                self.messages.close()
        finally:
            if self._shared is not None:
                environment.release(self._shared)
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
