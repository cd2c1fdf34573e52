"""RocksEngine: the RocksDB store's parts on one database, opened and closed together."""

from __future__ import annotations

from equeue_core.contracts import StoreSettings
from equeue_core.metadata import ScheduleInMeta, TopicsInMeta
from equeue_core.writer_lock import WriterLock

from . import database
from .index import RocksQueueIndex
from .offsets import RocksMeta, RocksOffsetStore
from .store import RocksMessageStore


class RocksEngine:
    """contracts.StoreEngine. RocksDB's own LOCK file already refuses a second primary; the data
    directory's writer lock is taken first anyway, so every store refuses a second writer with
    the same StoreLockedError naming the holder."""

    def __init__(self, settings: StoreSettings) -> None:
        self._lock = WriterLock.acquire(settings.data_dir)
        self._shared = None
        self.messages = None
        try:
            self._shared = database.acquire(settings.data_dir, settings.options)
            self.index = RocksQueueIndex(self._shared)
            self.messages = RocksMessageStore(settings, self._shared, self.index)
            self.recovery = self.messages.open()
            self.offsets = RocksOffsetStore(self._shared)
        except BaseException:
            self._release()
            raise
        meta = RocksMeta(self._shared)
        self.topics = TopicsInMeta(meta)
        self.schedule = ScheduleInMeta(meta, self.offsets)
        self._closed = False

    def _release(self) -> None:
        try:
            if self.messages is not None:
                self.messages.close()
        finally:
            if self._shared is not None:
                database.release(self._shared)
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
