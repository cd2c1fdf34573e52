"""Consumer offsets and metadata values in the store's RocksDB instance.

RocksOffsetStore: the behaviour is equeue_core.kv.offsets.KVOffsetStore's; here are RocksDB's
primitives: one WriteBatch written with sync per batch of offsets, so each write is durable before
it returns. RocksMeta: the `meta` column family, one synced write per value (the engine keeps topic
definitions and scheduler progress there through equeue_core.metadata).
"""

from __future__ import annotations

import rocksdict

from equeue_core.kv import keys
from equeue_core.kv.offsets import KVOffsetStore

from .database import SharedDb
from .store import write_options


class RocksOffsetStore(KVOffsetStore):
    def __init__(self, shared: SharedDb) -> None:
        self.shared = shared
        self._sync_opts = write_options(True)
        stored = {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                  for k, v in shared.view["offsets"].items()}
        super().__init__(stored)

    def _write_offsets(self, items: list[tuple[bytes, bytes]]) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, v in items:
            wb.put(k, v, self.shared.cf["offsets"])
        self.shared.db.write(wb, self._sync_opts)

    def _delete_offsets(self, prefix: bytes) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, _ in self.shared.view["offsets"].items(from_key=prefix):
            if not k.startswith(prefix):
                break
            wb.delete(k, self.shared.cf["offsets"])
        self.shared.db.write(wb, self._sync_opts)


class RocksMeta:
    """equeue_core.metadata.MetaValues over the `meta` column family."""

    def __init__(self, shared: SharedDb) -> None:
        self.shared = shared
        self._sync_opts = write_options(True)

    def read(self, key: str) -> bytes | None:
        return self.shared.view["meta"].get(key.encode())

    def write(self, key: str, value: bytes) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.put(key.encode(), bytes(value), self.shared.cf["meta"])
        self.shared.db.write(wb, self._sync_opts)
