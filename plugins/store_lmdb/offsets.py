"""LmdbOffsetStore: consumer offsets and broker metadata in the store's LMDB environment.

Commits land in memory (consumers commit every few seconds per queue; no need to write each);
`persist` writes every changed offset in one transaction and syncs, `close` persists. put_meta and
delete_group are written and synced before they return. Readers in other processes see the last
persisted offsets (StoreReader.group_offsets).
"""

from __future__ import annotations

import threading

from equeue_core.contracts import StoreSettings
from equeue_core.kv import keys

from . import environment


class LmdbOffsetStore:
    def __init__(self, settings: StoreSettings) -> None:
        self.shared = environment.acquire(settings.data_dir, settings.options)
        self.env = self.shared.env
        self.offsets_db = self.shared.db(b"offsets")
        self.meta_db = self.shared.db(b"meta")
        self._lock = threading.Lock()
        self._dirty: set[tuple[str, str, int]] = set()
        self._closed = False
        with self.env.begin() as txn:
            self._offsets = {keys.parse_offset_key(k): keys.U64_VALUE.unpack(v)[0]
                             for k, v in txn.cursor(self.offsets_db)}

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
            for k in [k for k in self._offsets if k[0] == group]:
                del self._offsets[k]
                self._dirty.discard(k)
            prefix = keys.offset_key_prefix(group)
            with self.env.begin(write=True) as txn:
                cur = txn.cursor(self.offsets_db)
                if cur.set_range(prefix):
                    while cur.key() and bytes(cur.key()).startswith(prefix):
                        cur.delete()
        self.env.sync(True)

    def get_meta(self, key: str) -> bytes | None:
        with self.env.begin() as txn:
            v = txn.get(key.encode(), db=self.meta_db)
        return bytes(v) if v is not None else None

    def put_meta(self, key: str, value: bytes) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(key.encode(), bytes(value), db=self.meta_db)
        self.env.sync(True)

    def persist(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            items = [(keys.offset_key(*k), keys.U64_VALUE.pack(self._offsets[k])) for k in dirty]
            if items:
                with self.env.begin(write=True) as txn:
                    txn.cursor(self.offsets_db).putmulti(items)
        if items:
            self.env.sync(True)

    def close(self) -> None:
        if self._closed:
            return
        self.persist()
        self._closed = True
        environment.release(self.shared)
