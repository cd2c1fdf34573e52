"""One LMDB environment per data directory per process: the engine's, and its readers'.

LMDB forbids opening one environment twice in a process (its locks are per process), so a reader
(StoreReader) in the process whose LmdbEngine holds the writable environment must reuse that one
(and so sees every commit at once). The engine acquires the environment here once and hands it to
its parts; each reader acquires it too; the last release closes it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import lmdb

from equeue_core.errors import StoreError

SUBDIR = "lmdb"
DB_NAMES = (b"log", b"index", b"queues", b"state", b"offsets", b"meta")
DEFAULT_MAP_SIZE = 1 << 38  # 256 GiB of address space; the file grows only as data is written


@dataclass(eq=False)
class SharedEnv:
    """An open environment and its named databases."""

    path: str
    env: lmdb.Environment
    dbs: dict[bytes, object]
    readonly: bool
    refs: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)

    def db(self, name: bytes) -> object:
        return self.dbs[name]


_lock = threading.Lock()
_open: dict[str, SharedEnv] = {}


def env_path(data_dir: str) -> str:
    return os.path.realpath(os.path.join(data_dir, SUBDIR))


def acquire(data_dir: str, options: dict | None = None, readonly: bool = False) -> SharedEnv:
    """The shared environment of data_dir, opened on first use.

    Writable opens create the environment and its databases; read-only opens need an existing one.
    Commits never fsync (sync=False): durability comes from the store's Flusher calling env.sync,
    which is what lets concurrent sync-mode senders share one fsync.
    """
    options = options or {}
    path = env_path(data_dir)
    with _lock:
        shared = _open.get(path)
        if shared is not None:
            if shared.readonly and not readonly:
                raise StoreError(f"LMDB store {path} is open read-only in this process; close readers first")
            shared.refs += 1
            return shared
        shared = _open_env(path, options, readonly)
        _open[path] = shared
        return shared


def _open_env(path: str, options: dict, readonly: bool) -> SharedEnv:
    map_size = int(options.get("map_size", DEFAULT_MAP_SIZE))
    try:
        if readonly:
            if not os.path.exists(os.path.join(path, "data.mdb")):
                raise StoreError(f"no LMDB store at {path}")
            env = lmdb.open(path, readonly=True, lock=True, max_dbs=len(DB_NAMES), map_size=map_size,
                            max_readers=int(options.get("max_readers", 256)))
            # open_db without a txn: a handle opened inside a read txn dies with that txn
            dbs = {n: env.open_db(n, create=False) for n in DB_NAMES}
        else:
            os.makedirs(path, exist_ok=True)
            env = lmdb.open(path, map_size=map_size, max_dbs=len(DB_NAMES), sync=False, metasync=False,
                            max_readers=int(options.get("max_readers", 256)), readahead=False)
            with env.begin(write=True) as txn:
                dbs = {n: env.open_db(n, txn=txn) for n in DB_NAMES}
            env.sync(True)
    except lmdb.Error as e:
        raise StoreError(f"cannot open LMDB store {path}: {e}") from e
    return SharedEnv(path, env, dbs, readonly)


def release(shared: SharedEnv) -> None:
    """Drop one reference; the last one closes the environment (after a final sync if writable)."""
    with _lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        _open.pop(shared.path, None)
    if not shared.readonly:
        shared.env.sync(True)
    shared.env.close()
