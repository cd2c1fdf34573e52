"""One RocksDB instance per data directory per process: the engine's primary, and its readers'.

The engine acquires the primary here once and hands it to its parts. A reader (StoreReader) in
the process holding the primary reuses it (and so sees every write at once); elsewhere it opens a
*secondary* instance, which follows the primary's WAL and MANIFEST on each `catch_up()`. The last
release closes an instance.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field

import rocksdict

from equeue_core.errors import ConfigError, StoreError

SUBDIR = "rocksdb"
CF_NAMES = ("log", "index", "queues", "state", "offsets", "meta")
COMPRESSIONS = ("none", "snappy", "lz4", "lz4hc", "zstd", "zlib", "bz2")
DEFAULT_COMPRESSION = "lz4"


@dataclass(eq=False)
class SharedDb:
    """An open database: `cf[name]` is the column family's handle (for write batches),
    `view[name]` its dict-like view (for reads)."""

    path: str
    db: rocksdict.Rdict
    cf: dict[str, rocksdict.ColumnFamily]
    view: dict[str, rocksdict.Rdict]
    mode: str  # "primary" | "secondary" | "read_only"
    refs: int = 1
    secondary_dir: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def catch_up(self) -> None:
        """Secondary only: apply what the primary wrote since the last call (no-op otherwise)."""
        if self.mode == "secondary":
            self.db.try_catch_up_with_primary()


_lock = threading.Lock()
_open: dict[tuple[str, str], SharedDb] = {}  # (path, mode) -> instance


def db_path(data_dir: str) -> str:
    return os.path.realpath(os.path.join(data_dir, SUBDIR))


DEFAULT_BLOCK_CACHE_MB = 128

_caches: dict[int, rocksdict.Cache] = {}


def _block_cache(mb: int) -> rocksdict.Cache:
    """One LRU block cache per size per process, shared by every column family: random reads
    decompress a whole chunk, so keeping hot chunks decompressed is what makes them cheap."""
    if mb not in _caches:
        _caches[mb] = rocksdict.Cache(mb * 1024 * 1024)
    return _caches[mb]


def column_options(options: dict) -> rocksdict.Options:
    """Options for every column family: compression from store_options.rocksdb.compression, a
    shared block cache of block_cache_mb."""
    name = str(options.get("compression", DEFAULT_COMPRESSION)).lower()
    if name not in COMPRESSIONS:
        raise ConfigError(f"unknown rocksdb compression {name!r}; choose one of {', '.join(COMPRESSIONS)}")
    opts = rocksdict.Options(raw_mode=True)
    opts.set_compression_type(getattr(rocksdict.DBCompressionType, name)())
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(_block_cache(int(options.get("block_cache_mb", DEFAULT_BLOCK_CACHE_MB))))
    opts.set_block_based_table_factory(table)
    return opts


def acquire(data_dir: str, options: dict | None = None, reader: bool = False) -> SharedDb:
    """The shared instance of data_dir. Writers get (and create) the primary; a reader gets the
    primary if this process has it open, else a secondary (or, with options mode=read_only, a
    read-only instance that never moves past what it saw at open)."""
    options = options or {}
    path = db_path(data_dir)
    with _lock:
        shared = _open.get((path, "primary"))
        if shared is None and reader:
            shared = _open.get((path, str(options.get("mode", "secondary"))))
        if shared is not None:
            shared.refs += 1
            return shared
        # A reader instance may coexist with a primary opened later in this process: RocksDB
        # allows secondary and read-only instances beside the one read-write instance.
        shared = _open_reader(path, options) if reader else _open_primary(path, options)
        _open[(path, shared.mode)] = shared
        return shared


def _views(path: str, db: rocksdict.Rdict, mode: str, secondary_dir: str | None = None) -> SharedDb:
    cf = {n: db.get_column_family_handle(n) for n in CF_NAMES}
    view = {n: db.get_column_family(n) for n in CF_NAMES}
    return SharedDb(path, db, cf, view, mode, secondary_dir=secondary_dir)


def _open_primary(path: str, options: dict) -> SharedDb:
    opts = column_options(options)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_background_jobs(int(options.get("background_jobs", 2)))
    opts.set_keep_log_file_num(3)
    try:
        os.makedirs(path, exist_ok=True)
        db = rocksdict.Rdict(path, opts, column_families={n: column_options(options) for n in CF_NAMES})
    except Exception as e:  # rocksdict raises plain Exception for RocksDB status errors
        raise StoreError(f"cannot open RocksDB store {path}: {e}") from e
    return _views(path, db, "primary")


def _open_reader(path: str, options: dict) -> SharedDb:
    if not os.path.exists(os.path.join(path, "CURRENT")):
        raise StoreError(f"no RocksDB store at {path}")
    mode = str(options.get("mode", "secondary"))
    if mode not in ("secondary", "read_only"):
        raise ConfigError(f"rocksdb reader mode must be 'secondary' or 'read_only', not {mode!r}")
    opts = column_options(options)
    opts.set_max_open_files(-1)  # a secondary must keep SSTs open: the primary may delete them
    secondary_dir = None
    if mode == "secondary":
        secondary_dir = tempfile.mkdtemp(prefix="equeue-rocksdb-secondary-")
        access = rocksdict.AccessType.secondary(secondary_dir)
    else:
        access = rocksdict.AccessType.read_only()
    try:
        db = rocksdict.Rdict(path, opts, column_families={n: column_options(options) for n in CF_NAMES},
                             access_type=access)
    except Exception as e:
        if secondary_dir:
            shutil.rmtree(secondary_dir, ignore_errors=True)
        raise StoreError(f"cannot open RocksDB store {path} as a reader: {e}") from e
    return _views(path, db, mode, secondary_dir)


def release(shared: SharedDb) -> None:
    """Drop one reference; the last one closes the instance (flushing the WAL if primary)."""
    with _lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        _open.pop((shared.path, shared.mode), None)
    if shared.mode == "primary":
        shared.db.flush_wal(True)
    # Every view and handle keeps RocksDB alive: drop them all so the LOCK is really released.
    for v in shared.view.values():
        v.close()
    shared.view.clear()
    shared.cf.clear()
    shared.db.close()
    shared.db = None  # type: ignore[assignment]  # the objects that shared it may outlive it
    if shared.secondary_dir:
        shutil.rmtree(shared.secondary_dir, ignore_errors=True)
