"""FileEngine: the file store's parts on one data directory, opened and closed together."""

from __future__ import annotations

from equeue_core.contracts import StoreSettings
from equeue_core.metadata import ScheduleInMeta, TopicsInMeta
from equeue_core.writer_lock import WriterLock

from .offsets import FileMeta, FileOffsetStore
from .queue_index import FileQueueIndex
from .replica_log import FileReplicaLog
from .store import FileMessageStore


class FileEngine:
    """contracts.StoreEngine: takes the data directory's writer lock first, then opens the index,
    recovers the commit log (FileMessageStore.open) and loads offsets.json; topic definitions and
    scheduler progress are files of their own under meta/ (offsets.py, FileMeta)."""

    def __init__(self, settings: StoreSettings) -> None:
        lock = WriterLock.acquire(settings.data_dir)
        self.index = self.messages = None
        try:
            self.index = FileQueueIndex(settings)
            self.messages = FileMessageStore(settings, self.index, writer_lock=lock)
            self.recovery = self.messages.open()
            self.offsets = FileOffsetStore(settings)
        except BaseException:
            self._abandon(lock)
            raise
        self.replica_log = FileReplicaLog(self.messages)
        meta = FileMeta(self.offsets, settings.data_dir)
        self.topics = TopicsInMeta(meta)
        self.schedule = ScheduleInMeta(meta, self.offsets)
        self._closed = False

    def _abandon(self, lock: WriterLock) -> None:
        """Undo a failed open: whatever was opened is closed, the lock released."""
        if self.messages is not None:
            self.messages.close()  # releases the lock it was given
        if self.index is not None:
            self.index.close()
        lock.release()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.offsets.close()  # persists
        finally:
            self.messages.close()  # flushes, checkpoints, closes its index, releases the lock
