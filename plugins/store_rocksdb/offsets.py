"""RocksOffsetStore: consumer offsets and broker metadata in the store's RocksDB instance.

The behaviour is equeue_core.kv.offsets.KVOffsetStore's; here are RocksDB's primitives: one
WriteBatch written with sync per batch of offsets, so each write is durable before it returns.
"""

from __future__ import annotations

import rocksdict

from equeue_core.contracts import StoreSettings
from equeue_core.kv import keys
from equeue_core.kv.offsets import KVOffsetStore

from . import database
from .store import write_options


class RocksOffsetStore(KVOffsetStore):
    def __init__(self, settings: StoreSettings) -> None:
        self.shared = database.acquire(settings.data_dir, settings.options)
        self._sync_opts = write_options(True)
        stored = {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                  for k, v in self.shared.view["offsets"].items()}
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

    def _read_meta(self, key: bytes) -> bytes | None:
        return self.shared.view["meta"].get(key)

    def _write_meta(self, key: bytes, value: bytes) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.put(key, value, self.shared.cf["meta"])
        self.shared.db.write(wb, self._sync_opts)

    def _release(self) -> None:
        database.release(self.shared)
