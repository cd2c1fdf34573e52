"""The LMDB event store: three named databases in one environment, one write transaction per batch.

A write transaction is exclusive across every process that opens the environment, so the unique
(aggregate id, version) and command id checks are `put(overwrite=False)` inside the transaction:
the first refused put aborts the transaction and nothing of the batch is written. Commits fsync
(option sync="false" leaves durability to the OS, for benchmarks). LMDB forbids opening one
environment twice in a process, so stores on the same path share it (reference counted).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator

import lmdb
from equeue_cqrs import store_keys as keys
from equeue_cqrs.errors import DuplicateCommandError, EventStoreError, VersionConflictError
from equeue_cqrs.store import CommandRecord, EventBatch, Snapshot, StoredEvent

DEFAULT_MAP_SIZE = 1 << 36  # 64 GiB of address space; the file grows only as data is written

_lock = threading.Lock()
_envs: dict[str, list] = {}  # real path -> [env, refs]


def _acquire(path: str, options: dict[str, str]) -> lmdb.Environment:
    real = os.path.realpath(path)
    with _lock:
        entry = _envs.get(real)
        if entry is None:
            os.makedirs(real, exist_ok=True)
            sync = str(options.get("sync", "true")).lower() not in ("false", "0", "no")
            try:
                env = lmdb.open(real, map_size=int(options.get("map_size", DEFAULT_MAP_SIZE)), max_dbs=4,
                                sync=sync, metasync=sync, readahead=False,
                                max_readers=int(options.get("max_readers", 256)))
            except lmdb.Error as e:
                raise EventStoreError(f"cannot open LMDB event store {real}: {e}") from e
            entry = _envs[real] = [env, 0]
        entry[1] += 1
        return entry[0]


def _release(path: str) -> None:
    real = os.path.realpath(path)
    with _lock:
        entry = _envs[real]
        entry[1] -= 1
        if entry[1]:
            return
        del _envs[real]
    entry[0].close()


class LmdbEventStore:
    """EventStore on LMDB. Options: sync ("true"), map_size (bytes), max_readers."""

    def __init__(self, path: str, options: dict[str, str] | None = None) -> None:
        self.path = path
        self.env = _acquire(path, options or {})
        with self.env.begin(write=True) as txn:
            self.events = self.env.open_db(b"events", txn=txn)
            self.commands = self.env.open_db(b"commands", txn=txn)
            self.snapshots = self.env.open_db(b"snapshots", txn=txn)
        self._closed = False

    def append(self, batch: EventBatch) -> None:
        self._check_open()
        event_key, event_value = keys.event_key, keys.event_value
        command_key, command_value = keys.command_key, keys.command_value
        events_db, commands_db = self.events, self.commands
        with self.env.begin(write=True) as txn:
            put = txn.put
            for e in batch.events:
                if not put(event_key(e.aggregate_id, e.version), event_value(e), db=events_db, overwrite=False):
                    raise VersionConflictError(e.aggregate_id, e.version)
            for c in batch.commands:
                if not put(command_key(c.command_id), command_value(c), db=commands_db, overwrite=False):
                    raise DuplicateCommandError(c.command_id, c.aggregate_id)
            for s in batch.snapshots:
                key = keys.check_id("aggregate id", s.aggregate_id)
                old = txn.get(key, db=self.snapshots)
                if old is None or keys.snapshot_from(s.aggregate_id, old).version < s.version:
                    txn.put(key, keys.snapshot_value(s), db=self.snapshots)

    def read_events(self, aggregate_id: str, from_version: int = 1,
                    to_version: int | None = None) -> list[StoredEvent]:
        self._check_open()
        with self.env.begin(db=self.events) as txn:
            cur = txn.cursor()
            if not cur.set_range(keys.event_key(aggregate_id, max(1, from_version))):
                return []
            return keys.events_of(keys.event_prefix(aggregate_id), cur, to_version)

    def command_results(self, command_ids: Iterable[str]) -> dict[str, CommandRecord]:
        self._check_open()
        out: dict[str, CommandRecord] = {}
        with self.env.begin(db=self.commands, buffers=False) as txn:
            get = txn.get
            for cid in command_ids:
                v = get(keys.command_key(cid))
                if v is not None:
                    out[cid] = keys.command_from(cid, v)
        return out

    def load_snapshot(self, aggregate_id: str) -> Snapshot | None:
        self._check_open()
        with self.env.begin(db=self.snapshots) as txn:
            v = txn.get(keys.check_id("aggregate id", aggregate_id))
        return None if v is None else keys.snapshot_from(aggregate_id, v)

    def iter_events(self) -> Iterator[StoredEvent]:
        self._check_open()
        with self.env.begin(db=self.events) as txn:
            for k, v in txn.cursor():
                yield keys.event_from(k, v)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _release(self.path)

    def _check_open(self) -> None:
        if self._closed:
            raise EventStoreError(f"LMDB event store {self.path} is closed")
