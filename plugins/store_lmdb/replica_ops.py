"""LmdbOps: equeue_core.kv.replica_log.KVOps over one LMDB transaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lmdb

from .environment import SharedEnv
from .snapshot import floor


class LmdbOps:
    def __init__(self, shared: SharedEnv, txn: lmdb.Transaction) -> None:
        self.txn = txn
        self.dbs = {name: shared.db(name.encode()) for name in ("log", "index", "queues", "state")}

    def floor(self, space: str, key: bytes) -> tuple[bytes, Any] | None:
        cur = self.txn.cursor(self.dbs[space])
        if not floor(cur, key):
            return None
        return bytes(cur.key()), cur.value()

    def scan_from(self, space: str, key: bytes) -> Iterator[tuple[bytes, Any]]:
        cur = self.txn.cursor(self.dbs[space])
        if not cur.set_range(key):
            return
        while True:
            yield bytes(cur.key()), cur.value()
            if not cur.next():
                return

    def put(self, space: str, key: bytes, value: bytes | memoryview) -> None:
        self.txn.put(key, value, db=self.dbs[space])

    def delete(self, space: str, key: bytes) -> None:
        self.txn.delete(key, db=self.dbs[space])
