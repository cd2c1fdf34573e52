"""Consumer offsets and metadata values in the store's LMDB environment.

LmdbOffsetStore: the behaviour is equeue_core.kv.offsets.KVOffsetStore's; here are LMDB's
primitives: one write transaction per batch of offsets, then env.sync, so each write is durable
before it returns. LmdbMeta: the `meta` database, one synced write transaction per value (the
engine keeps topic definitions and scheduler progress there through equeue_core.metadata).
"""

from __future__ import annotations

from equeue_core.kv import keys
from equeue_core.kv.offsets import KVOffsetStore

from .environment import SharedEnv


class LmdbOffsetStore(KVOffsetStore):
    def __init__(self, shared: SharedEnv) -> None:
        self.env = shared.env
        self.offsets_db = shared.db(b"offsets")
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


class LmdbMeta:
    """equeue_core.metadata.MetaValues over the `meta` database."""

    def __init__(self, shared: SharedEnv) -> None:
        self.env = shared.env
        self.meta_db = shared.db(b"meta")

    def read(self, key: str) -> bytes | None:
        with self.env.begin() as txn:
            v = txn.get(key.encode(), db=self.meta_db)
        return bytes(v) if v is not None else None

    def write(self, key: str, value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key.encode(), bytes(value), db=self.meta_db)
        self.env.sync(True)
