"""LmdbOffsetStore: consumer offsets and broker metadata in the store's LMDB environment.

The behaviour is equeue_core.kv.offsets.KVOffsetStore's; here are LMDB's primitives: one write
transaction per batch of offsets, then env.sync, so each write is durable before it returns.
"""

from __future__ import annotations

from equeue_core.contracts import StoreSettings
from equeue_core.kv import keys
from equeue_core.kv.offsets import KVOffsetStore

from . import environment


class LmdbOffsetStore(KVOffsetStore):
    def __init__(self, settings: StoreSettings) -> None:
        self.shared = environment.acquire(settings.data_dir, settings.options)
        self.env = self.shared.env
        self.offsets_db = self.shared.db(b"offsets")
        self.meta_db = self.shared.db(b"meta")
        with self.env.begin() as txn:
            stored = {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                      for k, v in txn.cursor(self.offsets_db)}
        super().__init__(stored)

    def _write_offsets(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor(self.offsets_db).putmulti(items)
        self.env.sync(True)

    def _delete_offsets(self, prefix: bytes) -> None:
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(self.offsets_db)
            if cur.set_range(prefix):
                while cur.key() and bytes(cur.key()).startswith(prefix):
                    cur.delete()
        self.env.sync(True)

    def _read_meta(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            v = txn.get(key, db=self.meta_db)
        return bytes(v) if v is not None else None

    def _write_meta(self, key: bytes, value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key, value, db=self.meta_db)
        self.env.sync(True)

    def _release(self) -> None:
        environment.release(self.shared)
