"""Consumer offsets for key-value store plugins: kept in memory, written through the engine in batches.

Commits land in memory (consumers commit every few seconds per queue; no need to write each);
`persist` writes every changed offset in one engine write and makes it durable (the engine
persists when it closes). delete_group is durable before it returns. Readers in other processes see the last
persisted offsets (StoreReader.group_offsets). Thread-safe: the broker commits on its event loop
and persists on another thread. The engine's durable write runs outside the lock commits take
(a commit on the loop thread never waits for a sync), and persists and group deletions write one
at a time, so the writes land in the order of the commits they carry.

A value the key layout cannot hold (equeue_core/offset_limits.py) is refused by `commit` with
InvalidOffsetError, so it never reaches a write; and a failed write leaves its offsets on the
dirty list, so the next persist retries them. One bad commit can never cost the others their
durability.

An engine subclass supplies two primitives (write offsets, delete by prefix).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod

from equeue_core.kv import keys
from equeue_core.offset_limits import check_offset

OffsetKey = tuple[str, str, int]


class KVOffsetStore(ABC):
    def __init__(self, stored: dict[OffsetKey, int]) -> None:
        self._lock = threading.Lock()  # _offsets and _dirty; never held across an engine write by persist
        self._write_lock = threading.Lock()  # one persist or group deletion writing at a time
        self._dirty: set[OffsetKey] = set()
        self._offsets = stored

    # ------------------------------------------------------------ engine primitives

    @abstractmethod
    def _write_offsets(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write (key, value) pairs in one engine write, durable before returning."""

    @abstractmethod
    def _delete_offsets(self, prefix: bytes) -> None:
        """Delete every offset key starting with prefix, durable before returning."""

    # ------------------------------------------------------------ ConsumerOffsets

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        check_offset(group, topic, queue_id, offset)
        with self._lock:
            self._offsets[(group, topic, queue_id)] = offset
            self._dirty.add((group, topic, queue_id))

    def all(self) -> dict[OffsetKey, int]:
        with self._lock:
            return dict(self._offsets)

    def delete_group(self, group: str) -> None:
        with self._write_lock, self._lock:  # no persist in flight could write the group back
            for k in [k for k in self._offsets if k[0] == group]:
                del self._offsets[k]
                self._dirty.discard(k)
            self._delete_offsets(keys.offset_key_prefix(group))

    def persist(self) -> None:
        """Write every offset changed since the last persist; on failure they are dirty again
        (unless a newer commit of theirs is dirty already, or their group was deleted)."""
        with self._write_lock:
            with self._lock:
                if not self._dirty:
                    return
                dirty, self._dirty = self._dirty, set()
                items = [(keys.offset_key(*k), keys.U64_VALUE.pack(self._offsets[k])) for k in dirty]
            try:
                self._write_offsets(items)
            except BaseException:
                with self._lock:  # the next persist retries them, with their values by then
                    self._dirty.update(k for k in dirty if k in self._offsets)
                raise
