"""LmdbEngine: the LMDB store's parts on one environment, opened and closed together."""

from __future__ import annotations

from equeue_core.contracts import StoreSettings
from equeue_core.kv.engine import KVEngine

from . import environment
from .index import LmdbQueueIndex
from .offsets import LmdbMeta, LmdbOffsetStore
from .store import LmdbMessageStore


class LmdbEngine(KVEngine):
    """contracts.StoreEngine. LMDB lets several processes write one environment (its lock file
    only serializes their transactions), but two brokers would each keep their own next position
    and queue ranges and overwrite each other's records: so the data directory's writer lock is
    taken before the environment is opened (KVEngine), and held until close."""

    def __init__(self, settings: StoreSettings) -> None:
        super().__init__(settings, acquire=environment.acquire, release=environment.release,
                         index=LmdbQueueIndex, messages=LmdbMessageStore, offsets=LmdbOffsetStore,
                         meta=LmdbMeta)
