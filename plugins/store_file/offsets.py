"""FileOffsetStore: consumer offsets and metadata values in one small JSON file, replaced atomically.

<data_dir>/offsets.json (docs/format.md, "Offsets file"):
  {"format": "equeue-offsets", "version": 1,
   "offsets": [[group, topic, queue_id, next_offset], ...],
   "meta": {key: base64(value), ...}}
persist() writes a snapshot to a temp file, fsyncs it, renames it over the old one and fsyncs the
directory, so after a crash the file holds the previous or the new snapshot, whole. commit() only
changes memory; put_meta() persists at once. Safe to call from several threads. FileMeta hands
the meta map to equeue_core.metadata, which keeps topic definitions and scheduler progress there.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading

from equeue_core.contracts import StoreSettings
from equeue_core.errors import StoreError
from equeue_core.offset_limits import check_offset

from .atomic import write_atomic
from .constants import OFFSETS

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
        return self._meta.get(key)

    def put_meta(self, key: str, value: bytes) -> None:
        """Store and persist before returning (fsyncs on the calling thread)."""
        with self._lock:
            self._meta[key] = bytes(value)
            self._dirty = True
        self.persist(force=True)

    def persist(self, force: bool = False) -> None:
        """Write the current snapshot atomically (skipped if nothing changed since the last one)."""
        with self._persist_lock:
            with self._lock:
                if not (self._dirty or force):
                    return
                doc = {
                    "format": FORMAT,
                    "version": 1,
                    "offsets": [[g, t, q, o] for (g, t, q), o in sorted(self._offsets.items())],
                    "meta": {k: base64.b64encode(v).decode() for k, v in sorted(self._meta.items())},
                }
                self._dirty = False
            try:
                write_atomic(self.path, json.dumps(doc, separators=(",", ":")).encode())
            except BaseException:
                self._dirty = True
                raise

    def close(self) -> None:
        self.persist()


class FileMeta:
    """equeue_core.metadata.MetaValues over the offsets file's meta map."""

    def __init__(self, offsets: FileOffsetStore) -> None:
        self._offsets = offsets

    def read(self, key: str) -> bytes | None:
        return self._offsets.get_meta(key)

    def write(self, key: str, value: bytes) -> None:
        self._offsets.put_meta(key, value)
