"""Offsets for key-value store plugins: kept in memory, written through the engine in batches.

Commits land in memory (consumers commit every few seconds per queue; no need to write each);
`persist` writes every changed offset in one engine write and makes it durable, `close`
persists. put_meta and delete_group are durable before they return. Readers in other processes
see the last persisted offsets (StoreReader.group_offsets). Thread-safe: the broker commits on
its event loop and persists on another thread.

An engine subclass supplies four primitives (write offsets, delete by prefix, read and write a
meta value) and `_release`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from equeue_core.kv import keys

OffsetKey = tuple[str, str, int]


class KVOffsetStore(ABC):
    def __init__(self, stored: dict[OffsetKey, int]) -> None:
        self._lock = threading.Lock()
        self._dirty: set[OffsetKey] = set()
        self._closed = False
        self._offsets = stored

    # ------------------------------------------------------------ engine primitives

    @abstractmethod
    def _write_offsets(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write (key, value) pairs in one engine write, durable before returning."""

    @abstractmethod
    def _delete_offsets(self, prefix: bytes) -> None:
        """Delete every offset key starting with prefix, durable before returning."""

    @abstractmethod
    def _read_meta(self, key: bytes) -> bytes | None:
        """The metadata value of key, or None."""

    @abstractmethod
    def _write_meta(self, key: bytes, value: bytes) -> None:
        """Store a metadata value, durable before returning."""

    @abstractmethod
    def _release(self) -> None:
        """Release the engine handle shared with the store."""

    # ------------------------------------------------------------ OffsetStore

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._offsets[(group, topic, queue_id)] = offset
            self._dirty.add((group, topic, queue_id))

    def all(self) -> dict[OffsetKey, int]:
        with self._lock:
            return dict(self._offsets)

    def delete_group(self, group: str) -> None:
        with self._lock:
            for k in [k for k in self._offsets if k[0] == group]:
                del self._offsets[k]
                self._dirty.discard(k)
            self._delete_offsets(keys.offset_key_prefix(group))

    def get_meta(self, key: str) -> bytes | None:
        return self._read_meta(key.encode())

    def put_meta(self, key: str, value: bytes) -> None:
        self._write_meta(key.encode(), bytes(value))

    def persist(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if dirty:
                self._write_offsets([(keys.offset_key(*k), keys.U64_VALUE.pack(self._offsets[k])) for k in dirty])

    def close(self) -> None:
        if self._closed:
            return
        self.persist()
        self._closed = True
        self._release()
