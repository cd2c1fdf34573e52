"""RocksEngine: the RocksDB store's parts on one database, opened and closed together."""

from __future__ import annotations

from equeue_core.contracts import StoreSettings
from equeue_core.kv.engine import KVEngine

from . import database
from .index import RocksQueueIndex
from .offsets import RocksMeta, RocksOffsetStore
from .store import RocksMessageStore


class RocksEngine(KVEngine):
    """contracts.StoreEngine. RocksDB's own LOCK file already refuses a second primary; the data
    directory's writer lock is taken first anyway (KVEngine), so every store refuses a second
    writer with the same StoreLockedError naming the holder."""

    def __init__(self, settings: StoreSettings) -> None:
        super().__init__(settings, acquire=database.acquire, release=database.release,
                         index=RocksQueueIndex, messages=RocksMessageStore, offsets=RocksOffsetStore,
                         meta=RocksMeta)
