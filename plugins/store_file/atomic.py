"""The file store's file-write helpers: the kernel's atomic small-file replace and directory fsync
(equeue_core.atomic_file, shared with the replication epoch file), and `write_all` for appends
(the queue index's entries, the offsets log's records)."""

from __future__ import annotations

import os

from equeue_core.atomic_file import fsync_dir, write_atomic

__all__ = ["fsync_dir", "write_all", "write_atomic"]


def write_all(fd: int, data: memoryview | bytes | bytearray) -> None:
    """os.write until every byte of `data` is written (a short write continues where it stopped)."""
    n = os.write(fd, data)  # the usual case: all of it in one write
    if n == len(data):
        return
    mv = memoryview(data)[n:]
    while mv:
        n = os.write(fd, mv)
        mv = mv[n:]
