"""RocksOps: equeue_core.kv.replica_log.KVOps over a RocksDB WriteBatch and the database's reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import rocksdict

from .database import SharedDb


class RocksOps:
    """Reads see the database before the batch is written (the batch is applied in one write)."""

    def __init__(self, shared: SharedDb) -> None:
        self.shared = shared
        self.wb = rocksdict.WriteBatch(raw_mode=True)

    def floor(self, space: str, key: bytes) -> tuple[bytes, Any] | None:
        it = self.shared.view[space].iter()
        it.seek_for_prev(key)
        found = (bytes(it.key()), it.value()) if it.valid() else None
        del it
        return found

    def scan_from(self, space: str, key: bytes) -> Iterator[tuple[bytes, Any]]:
        it = self.shared.view[space].iter()
        it.seek(key)
        while it.valid():
            yield bytes(it.key()), it.value()
            it.next()
        del it

    def put(self, space: str, key: bytes, value: bytes | memoryview) -> None:
        self.wb.put(key, bytes(value), self.shared.cf[space])

    def delete(self, space: str, key: bytes) -> None:
        self.wb.delete(key, self.shared.cf[space])
