"""The RocksDB event store: three column families, one synced WriteBatch per appended batch.

RocksDB has no check-and-put, so the unique (aggregate id, version) and command id checks are a
multi-get under a per-database lock followed by the WriteBatch: atomic within the process, and one
process owns the database (RocksDB's LOCK file refuses a second read-write open), so no other
writer can slip in between. Several processor processes need a store they can share (LMDB).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator

import rocksdict
from equeue_cqrs import store_keys as keys
from equeue_cqrs.errors import DuplicateCommandError, EventStoreError, VersionConflictError
from equeue_cqrs.store import CommandRecord, EventBatch, Snapshot, StoredEvent, check_batch

CF_NAMES = ("events", "commands", "snapshots")

_lock = threading.Lock()
_dbs: dict[str, list] = {}  # real path -> [db, views, handles, write lock, refs]


def _options() -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    return opts


def _acquire(path: str) -> list:
    real = os.path.realpath(path)
    with _lock:
        entry = _dbs.get(real)
        if entry is None:
            opts = _options()
            opts.create_if_missing(True)
            opts.create_missing_column_families(True)
            try:
                os.makedirs(real, exist_ok=True)
                db = rocksdict.Rdict(real, opts, column_families={n: _options() for n in CF_NAMES})
            except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
                raise EventStoreError(f"cannot open RocksDB event store {real}: {e}") from e
            views = {n: db.get_column_family(n) for n in CF_NAMES}
            handles = {n: db.get_column_family_handle(n) for n in CF_NAMES}
            entry = _dbs[real] = [db, views, handles, threading.Lock(), 0]
        entry[4] += 1
        return entry


def _release(path: str) -> None:
    real = os.path.realpath(path)
    with _lock:
        entry = _dbs[real]
        entry[4] -= 1
        if entry[4]:
            return
        del _dbs[real]
    db, views, handles = entry[0], entry[1], entry[2]
    db.flush_wal(True)
    for v in views.values():
        v.close()
    views.clear()
    handles.clear()
    db.close()


class RocksdbEventStore:
    """EventStore on RocksDB. Options: sync ("true": every batch is fsynced through the WAL)."""

    def __init__(self, path: str, options: dict[str, str] | None = None) -> None:
        self.path = path
        entry = _acquire(path)
        self._db, self._views, self._cf, self._write_lock = entry[0], entry[1], entry[2], entry[3]
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.sync = str((options or {}).get("sync", "true")).lower() not in ("false", "0", "no")
        self._closed = False

    def append(self, batch: EventBatch) -> None:
        self._check_open()
        event_key, command_key = keys.event_key, keys.command_key
        event_keys = [event_key(e.aggregate_id, e.version) for e in batch.events]
        command_keys = [command_key(c.command_id) for c in batch.commands]
        # A key names its (aggregate id, version) or command id one to one, so a repeat inside the
        # batch shows as fewer distinct keys; check_batch then names it (cheaper than always).
        if len(set(event_keys)) != len(event_keys) or len(set(command_keys)) != len(command_keys):
            check_batch(batch)
        wb = rocksdict.WriteBatch(raw_mode=True)
        events_cf, commands_cf, snapshots_cf = self._cf["events"], self._cf["commands"], self._cf["snapshots"]
        with self._write_lock:
            if event_keys:
                for e, found in zip(batch.events, self._views["events"].get(event_keys), strict=True):
                    if found is not None:
                        raise VersionConflictError(e.aggregate_id, e.version)
            if command_keys:
                for c, found in zip(batch.commands, self._views["commands"].get(command_keys), strict=True):
                    if found is not None:
                        raise DuplicateCommandError(c.command_id, c.aggregate_id)
            put, event_value, command_value = wb.put, keys.event_value, keys.command_value
            for k, e in zip(event_keys, batch.events, strict=True):
                put(k, event_value(e), events_cf)
            for k, c in zip(command_keys, batch.commands, strict=True):
                put(k, command_value(c), commands_cf)
            for s in batch.snapshots:
                key = keys.check_id("aggregate id", s.aggregate_id)
                old = self._views["snapshots"].get(key)
                if old is None or keys.snapshot_from(s.aggregate_id, old).version < s.version:
                    wb.put(key, keys.snapshot_value(s), snapshots_cf)
            self._db.write(wb, self._write_opts)

    def read_events(self, aggregate_id: str, from_version: int = 1,
                    to_version: int | None = None) -> list[StoredEvent]:
        self._check_open()
        pairs = self._views["events"].items(from_key=keys.event_key(aggregate_id, max(1, from_version)))
        return keys.events_of(keys.event_prefix(aggregate_id), pairs, to_version)

    def command_results(self, command_ids: Iterable[str]) -> dict[str, CommandRecord]:
        self._check_open()
        ids = list(command_ids)
        if not ids:
            return {}
        found = self._views["commands"].get([keys.command_key(c) for c in ids])
        return {cid: keys.command_from(cid, v) for cid, v in zip(ids, found, strict=True) if v is not None}

    def load_snapshot(self, aggregate_id: str) -> Snapshot | None:
        self._check_open()
        v = self._views["snapshots"].get(keys.check_id("aggregate id", aggregate_id))
        return None if v is None else keys.snapshot_from(aggregate_id, v)

    def iter_events(self) -> Iterator[StoredEvent]:
        self._check_open()
        for k, v in self._views["events"].items():
            yield keys.event_from(k, v)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _release(self.path)

    def _check_open(self) -> None:
        if self._closed:
            raise EventStoreError(f"RocksDB event store {self.path} is closed")
