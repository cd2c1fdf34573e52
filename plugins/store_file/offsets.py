"""FileOffsetStore: consumer offsets in a snapshot file and a log of what changed since; FileMeta:
broker metadata values in small files of their own.

<data_dir>/offsets.json, the snapshot (docs/format.md, "Offsets file"):
  {"format": "equeue-offsets", "version": 1, "log": generation,
   "offsets": [[group, topic, queue_id, next_offset], ...],
   "meta": {key: base64(value), ...}}
<data_dir>/offsets.<generation>.log, what was committed after it (offsets_log.py).

persist() appends the offsets that changed since the persist before as one record of the log and
fdatasyncs it; a record is whole or ignored, so a persist is atomic. When the log has grown past
the snapshot (and at least COMPACT_MIN_BYTES), or a metadata value left the snapshot, persist()
writes a new snapshot instead (temp file, fsync, rename, fsync directory) naming the next
generation, then removes the old log. After a crash the snapshot names the log that continues
it; any other log is stale and is removed at open. A snapshot without "log" (written by a store
before the log) has none, so a first persist of such a store writes a snapshot. commit() only
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
import logging
import os
import re
import threading
from dataclasses import dataclass, field

import msgspec

from equeue_core.contracts import StoreSettings
from equeue_core.errors import StoreError
from equeue_core.offset_limits import check_offset

from . import offsets_log
from .atomic import fsync_dir, write_all, write_atomic
from .constants import META_DIR, OFFSETS

log = logging.getLogger(__name__)

FORMAT = "equeue-offsets"
COMPACT_MIN_BYTES = 1 << 20  # the log is not folded into a new snapshot below this size
LOAD_ATTEMPTS = 3  # a reader racing a compaction reads the new snapshot again (load_offsets)


@dataclass
class LoadedOffsets:
    """What an offsets snapshot and its log hold."""

    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    meta: dict[str, bytes] = field(default_factory=dict)
    generation: int = 0  # the snapshot's "log": 0 when it names none (or there is no snapshot)
    snapshot_bytes: int = 0
    log_bytes: int = 0  # where the whole records of the log end (a torn last append starts there)
    log_size: int = 0  # the log file's size as read


def load_offsets(data_dir: str) -> LoadedOffsets:
    """The snapshot and its log. A reader may race the writer's compaction (the log named by the
    snapshot it read is gone, folded into a newer snapshot): then it reads the snapshot again."""
    path = os.path.join(data_dir, OFFSETS)
    for _ in range(LOAD_ATTEMPTS):
        loaded = _read_snapshot(path)
        if not loaded.generation:
            return loaded
        try:
            with open(offsets_log.log_path(data_dir, loaded.generation), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if _read_snapshot_generation(path) != loaded.generation:
                continue  # compacted meanwhile: the new snapshot has it all
            return loaded  # nothing committed since the snapshot (the log is made by the first append)
        entries, loaded.log_bytes = offsets_log.read_records(data)
        loaded.log_size = len(data)
        offsets_log.apply(loaded.offsets, entries)
        return loaded
    raise StoreError(f"{path}: the offsets snapshot kept changing while it was read")


class _Snapshot(msgspec.Struct):
    """offsets.json as msgspec decodes it: typed, each entry a tuple. json.loads made a list per
    offset, and with 100k of them the collector's passes over a broker-sized heap tripled the
    load (35 against 80-116 ms in a probe), paid at every start and every reader's look."""

    format: str = ""
    version: int = 0
    offsets: list[tuple[str, str, int, int]] = []
    meta: dict[str, str] = {}
    log: int = 0


_decode_snapshot = msgspec.json.Decoder(_Snapshot).decode


def _read_snapshot(path: str) -> LoadedOffsets:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return LoadedOffsets()
    try:
        doc = _decode_snapshot(raw)
    except msgspec.DecodeError as e:  # not JSON, or not this shape
        raise StoreError(f"offsets file {path} is damaged: {e}") from e
    if doc.format != FORMAT or doc.version != 1:
        raise StoreError(f"{path} is not an {FORMAT} v1 file")
    offsets = {(g, t, q): o for g, t, q, o in doc.offsets}
    meta = {k: base64.b64decode(v) for k, v in doc.meta.items()}
    return LoadedOffsets(offsets, meta, doc.log, len(raw))


def _read_snapshot_generation(path: str) -> int:
    try:
        return _read_snapshot(path).generation
    except StoreError:
        return -1


class FileOffsetStore:
    def __init__(self, settings: StoreSettings) -> None:
        os.makedirs(settings.data_dir, exist_ok=True)
        self.data_dir = settings.data_dir
        self.path = os.path.join(settings.data_dir, OFFSETS)
        loaded = load_offsets(settings.data_dir)
        self._offsets, self._meta = loaded.offsets, loaded.meta
        self._generation = loaded.generation
        self._snapshot_bytes = loaded.snapshot_bytes
        self._log_bytes = loaded.log_bytes
        self._log_fd: int | None = None
        self._clean_logs(loaded)
        self._lock = threading.Lock()
        self._persist_lock = threading.Lock()
        # each key changed since the last persist, and its offset (offsets_log.DELETED once removed)
        self._changed: dict[tuple[str, str, int], int] = {}
        # the next persist writes a snapshot: no log to append to yet, or `meta` changed
        self._snapshot_due = not self._generation

    def _clean_logs(self, loaded: LoadedOffsets) -> None:
        """At open, as the one writer: remove stale logs, and cut a torn last append off the log
        (a record appended after it would never be read)."""
        named = offsets_log.log_path(self.data_dir, loaded.generation) if loaded.generation else None
        for name in os.listdir(self.data_dir):
            path = os.path.join(self.data_dir, name)
            if offsets_log.is_log_name(name) and path != named:
                os.unlink(path)
        if named is not None and loaded.log_size > loaded.log_bytes:
            log.warning("offsets log %s: cutting %d bytes of a torn last append", named,
                        loaded.log_size - loaded.log_bytes)
            os.truncate(named, loaded.log_bytes)

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Remember the next offset to consume (in memory until persist()); InvalidOffsetError
        for one outside the limits every store keeps (equeue_core/offset_limits.py)."""
        check_offset(group, topic, queue_id, offset)
        key = (group, topic, queue_id)
        offset = int(offset)
        with self._lock:
            self._offsets[key] = offset
            self._changed[key] = offset

    def all(self) -> dict[tuple[str, str, int], int]:
        with self._lock:
            return dict(self._offsets)

    def delete_group(self, group: str) -> None:
        with self._lock:
            for key in [k for k in self._offsets if k[0] == group]:
                del self._offsets[key]
                self._changed[key] = offsets_log.DELETED

    def get_meta(self, key: str) -> bytes | None:
        """A metadata value an older store kept in this file (FileMeta reads it until it moves)."""
        return self._meta.get(key)

    def drop_meta(self, key: str) -> None:
        """Stop carrying a metadata value that moved to a file of its own (from the next persist)."""
        with self._lock:
            if self._meta.pop(key, None) is not None:
                self._snapshot_due = True

    def persist(self, force: bool = False) -> None:
        """Make every committed offset durable: append what changed since the last persist to the
        log, or (past COMPACT_MIN_BYTES and the snapshot's size, or `force`) write a snapshot of
        everything. Skipped if nothing changed.

        The broker calls it on a worker thread. What it writes is taken under the lock its loop
        thread's commits take (for a snapshot, every offset), and encoding holds the GIL: so the
        usual persist takes and encodes only the offsets that moved (0.2-0.3 ms against 20-40
        ms for 100k offsets as a snapshot). The write and its fsync run outside that lock."""
        with self._persist_lock:
            with self._lock:
                if not (self._changed or self._snapshot_due or force):
                    return
                changed, self._changed = self._changed, {}
                snapshot = (force or self._snapshot_due
                            or self._log_bytes >= max(COMPACT_MIN_BYTES, self._snapshot_bytes))
                if snapshot:
                    doc = {
                        "format": FORMAT,
                        "version": 1,
                        "log": self._generation + 1,
                        "offsets": [[g, t, q, o] for (g, t, q), o in self._offsets.items()],
                        "meta": {k: base64.b64encode(v).decode() for k, v in sorted(self._meta.items())},
                    }
                    self._snapshot_due = False
            try:
                if snapshot:
                    self._write_snapshot(msgspec.json.encode(doc))
                else:
                    self._append(offsets_log.encode_record(changed.items()))
            except BaseException:
                with self._lock:  # what moved since stays newer: only the rest is marked again
                    for key in changed:
                        if key not in self._changed:
                            self._changed[key] = self._offsets.get(key, offsets_log.DELETED)
                    if snapshot:
                        self._snapshot_due = True
                raise

    def _write_snapshot(self, data: bytes) -> None:
        """A snapshot naming the next generation, then the old log removed (a crash between the
        two leaves a stale log, which the next open removes)."""
        write_atomic(self.path, data)
        old = self._generation
        self._generation += 1
        self._snapshot_bytes = len(data)
        self._log_bytes = 0
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if old:
            try:
                os.unlink(offsets_log.log_path(self.data_dir, old))
            except FileNotFoundError:
                pass

    def _append(self, record: bytes) -> None:
        """One record at the log's end, fdatasync'ed. A failed append is cut off again, so no
        later record follows a torn one; if even that fails, the next persist writes a
        snapshot (a new log) instead."""
        if self._log_fd is None:
            path = offsets_log.log_path(self.data_dir, self._generation)
            made = not os.path.exists(path)
            self._log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            if made:
                fsync_dir(self.data_dir)  # the new log's name survives a crash
        try:
            write_all(self._log_fd, record)
            os.fdatasync(self._log_fd)
        except BaseException:
            try:
                os.ftruncate(self._log_fd, self._log_bytes)
            except OSError:
                with self._lock:
                    self._snapshot_due = True
            raise
        self._log_bytes += len(record)

    def close(self) -> None:
        self.persist()
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None


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
