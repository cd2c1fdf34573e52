"""The single-writer lock of a data directory: one broker writes it, whatever the store.

`<data_dir>/lock` is a small file its writer holds an exclusive flock(2) on and into which it
writes its pid. flock locks belong to an open file, so a second writer is refused whether it is
another process or another engine in the same process, and the kernel drops the lock of a
process that dies (kill -9 included): no stale lock to clean up. Readers (StoreReader) never
take it. Every built-in store engine takes it before it touches a file; LMDB, whose own lock file
lets several processes write, depends on it.
"""

from __future__ import annotations

import fcntl
import os

from equeue_core.errors import StoreLockedError

LOCK_FILE = "lock"


class WriterLock:
    """Held from acquire() until release() (or the process ends)."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, data_dir: str) -> WriterLock:
        """Take the lock of data_dir (created if missing) or raise StoreLockedError naming the
        directory and the pid written by the holder."""
        os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another writer"
            raise StoreLockedError(f"data directory {os.path.abspath(data_dir)} is open for writing by {who}; "
                                   "stop it first (readers do not need the lock)",
                                   data_dir=os.path.abspath(data_dir), pid=holder or 0) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Drop the lock (idempotent). The pid stays in the file: harmless, the flock decides."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the file drops the flock


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None
