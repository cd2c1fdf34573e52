"""FileOffsetStore: consumer offsets in one JSON file, replaced atomically; FileMeta: broker
metadata values in small files of their own.

<data_dir>/offsets.json (docs/format.md, "Offsets file"):
  {"format": "equeue-offsets", "version": 1,
   "offsets": [[group, topic, queue_id, next_offset], ...],
   "meta": {key: base64(value), ...}}
persist() writes a snapshot to a temp file, fsyncs it, renames it over the old one and fsyncs the
directory, so after a crash the file holds the previous or the new snapshot, whole. commit() only
changes memory. Safe to call from several threads.

FileMeta keeps each metadata value (equeue_core.metadata: topic definitions, scheduler progress)
in <data_dir>/meta/<key>, replaced the same way. A store written before kept them in the offsets
file's `meta` map: they are read from there until their first write moves them, and the offsets
file drops them at its next persist. Why files of their own: the offsets file holds every
committed offset of every group, and a value written there rewrote all of them. With 100k
committed offsets each topic created stalled the broker's loop 89-232 ms, and each delivery of
delayed messages (its progress) cost as much CPU under the GIL (docs/benchmarks.md, "Topic
definitions out of the offsets file").
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading

import msgspec

from equeue_core.contracts import StoreSettings
from equeue_core.errors import StoreError
from equeue_core.offset_limits import check_offset

from .atomic import fsync_dir, write_atomic
from .constants import META_DIR, OFFSETS

log = logging.getLogger(__name__)

FORMAT = "equeue-offsets"


def load_offsets_file(path: str) -> tuple[dict[tuple[str, str, int], int], dict[str, bytes]]:
    """(offsets, meta) from an offsets file; empty if there is none."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return {}, {}
    except ValueError as e:
        raise StoreError(f"offsets file {path} is damaged: {e}") from e
    if doc.get("format") != FORMAT or int(doc.get("version", 0)) != 1:
        raise StoreError(f"{path} is not an {FORMAT} v1 file")
    offsets = {(g, t, int(q)): int(o) for g, t, q, o in doc.get("offsets", [])}
    meta = {k: base64.b64decode(v) for k, v in doc.get("meta", {}).items()}
    return offsets, meta


class FileOffsetStore:
    def __init__(self, settings: StoreSettings) -> None:
        os.makedirs(settings.data_dir, exist_ok=True)
        self.path = os.path.join(settings.data_dir, OFFSETS)
        self._offsets, self._meta = load_offsets_file(self.path)
        self._lock = threading.Lock()
        self._persist_lock = threading.Lock()
        self._dirty = False

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Remember the next offset to consume (in memory until persist()); InvalidOffsetError
        for one outside the limits every store keeps (equeue_core/offset_limits.py)."""
        check_offset(group, topic, queue_id, offset)
        with self._lock:
            self._offsets[(group, topic, queue_id)] = int(offset)
            self._dirty = True

    def all(self) -> dict[tuple[str, str, int], int]:
        with self._lock:
            return dict(self._offsets)

    def delete_group(self, group: str) -> None:
        with self._lock:
            for key in [k for k in self._offsets if k[0] == group]:
                del self._offsets[key]
            self._dirty = True

    def get_meta(self, key: str) -> bytes | None:
        """A metadata value an older store kept in this file (FileMeta reads it until it moves)."""
        return self._meta.get(key)

    def drop_meta(self, key: str) -> None:
        """Stop carrying a metadata value that moved to a file of its own (from the next persist)."""
        with self._lock:
            if self._meta.pop(key, None) is not None:
                self._dirty = True

    def persist(self, force: bool = False) -> None:
        """Write the current snapshot atomically (skipped if nothing changed since the last one).

        The broker calls it on a worker thread, but the snapshot is built under the lock its
        loop thread's commits take, and building and encoding hold the GIL: offsets in the order
        they were first committed (not sorted) and msgspec's encoder, 108 -> 18 ms for 100k
        offsets in a process holding 300k other objects (docs/benchmarks.md, "Topic definitions
        out of the offsets file")."""
        with self._persist_lock:
            with self._lock:
                if not (self._dirty or force):
                    return
                doc = {
                    "format": FORMAT,
                    "version": 1,
                    "offsets": [[g, t, q, o] for (g, t, q), o in self._offsets.items()],
                    "meta": {k: base64.b64encode(v).decode() for k, v in sorted(self._meta.items())},
                }
                self._dirty = False
            try:
                write_atomic(self.path, msgspec.json.encode(doc))
            except BaseException:
                self._dirty = True
                raise

    def close(self) -> None:
        self.persist()


class FileMeta:
    """equeue_core.metadata.MetaValues: each key in <data_dir>/meta/<key>, durable when write()
    returns (module docstring)."""

    def __init__(self, offsets: FileOffsetStore, data_dir: str) -> None:
        self._offsets = offsets
        self._data_dir = data_dir
        self._dir = os.path.join(data_dir, META_DIR)
        self._dir_made = os.path.isdir(self._dir)

    def _path(self, key: str) -> str:
        if not _META_KEY.fullmatch(key):
            raise StoreError(f"metadata key {key!r} cannot be a file name")
        return os.path.join(self._dir, key)

    def read(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return self._offsets.get_meta(key)  # written by an older store, not moved yet

    def write(self, key: str, value: bytes) -> None:
        path = self._path(key)
        if not self._dir_made:
            os.makedirs(self._dir, exist_ok=True)
            fsync_dir(self._data_dir)  # the directory itself survives a crash
            self._dir_made = True
        write_atomic(path, bytes(value))
        self._offsets.drop_meta(key)


_META_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")
