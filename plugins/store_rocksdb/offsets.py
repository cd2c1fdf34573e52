"""RocksOffsetStore: consumer offsets and broker metadata in the store's RocksDB instance.

Commits land in memory (consumers commit every few seconds per queue; no need to write each);
`persist` writes every changed offset in one synced WriteBatch, `close` persists. put_meta and
delete_group are written with sync before they return. Readers in other processes see the last
persisted offsets (StoreReader.group_offsets).
"""

from __future__ import annotations

import threading

import rocksdict

from equeue_core.contracts import StoreSettings
from equeue_core.kv import keys

from . import database
from .store import write_options


class RocksOffsetStore:
    def __init__(self, settings: StoreSettings) -> None:
        self.shared = database.acquire(settings.data_dir, settings.options)
        self._sync_opts = write_options(True)
        self._lock = threading.Lock()
        self._dirty: set[tuple[str, str, int]] = set()
        self._closed = False
        self._offsets = {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                         for k, v in self.shared.view["offsets"].items()}

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._offsets[(group, topic, queue_id)] = offset
            self._dirty.add((group, topic, queue_id))

    def all(self) -> dict[tuple[str, str, int], int]:
        return dict(self._offsets)

    def delete_group(self, group: str) -> None:
        with self._lock:
            gone = [k for k in self._offsets if k[0] == group]
            for k in gone:
                del self._offsets[k]
                self._dirty.discard(k)
            wb = rocksdict.WriteBatch(raw_mode=True)
            for k, _ in self.shared.view["offsets"].items(from_key=keys.offset_key_prefix(group)):
                if not k.startswith(keys.offset_key_prefix(group)):
                    break
                wb.delete(k, self.shared.cf["offsets"])
            self.shared.db.write(wb, self._sync_opts)

    def get_meta(self, key: str) -> bytes | None:
        return self.shared.view["meta"].get(key.encode())

    def put_meta(self, key: str, value: bytes) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.put(key.encode(), bytes(value), self.shared.cf["meta"])
        self.shared.db.write(wb, self._sync_opts)

    def persist(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if not dirty:
                return
            wb = rocksdict.WriteBatch(raw_mode=True)
            for k in dirty:
                wb.put(keys.offset_key(*k), keys.U64_VALUE.pack(self._offsets[k]), self.shared.cf["offsets"])
            self.shared.db.write(wb, self._sync_opts)

    def close(self) -> None:
        if self._closed:
            return
        self.persist()
        self._closed = True
        database.release(self.shared)
