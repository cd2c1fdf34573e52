"""Read access to one commit-log chunk file through a read-only mmap, growable and droppable.

The mapping covers the file as long as it was when mapped; a read past that remaps to the file's
current length (the newest chunk grows while it is read). Old mappings are never closed
explicitly: another thread may be slicing one, so a map goes away when its last reference does.
The (map, length) pair is swapped as one tuple so a concurrent reader never pairs a new length
with an old map.
"""

from __future__ import annotations

import mmap
import os
import time


class MappedChunk:
    __slots__ = ("start", "path", "mapping", "last_used")

    def __init__(self, start: int, path: str) -> None:
        self.start = start
        self.path = path
        self.mapping: tuple[mmap.mmap, int] | None = None
        self.last_used = 0.0

    @property
    def mapped_bytes(self) -> int:
        m = self.mapping
        return m[1] if m is not None else 0

    def _map(self, end: int) -> tuple[mmap.mmap, int] | None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < end or size == 0:
                return None
            m = (mmap.mmap(fd, size, access=mmap.ACCESS_READ), size)
        finally:
            os.close(fd)
        self.mapping = m
        return m

    def _covering(self, end: int) -> mmap.mmap | None:
        """A map of the file through at least `end` (remapped if the file grew), or None."""
        m = self.mapping
        if m is None or end > m[1]:
            m = self._map(end)
            if m is None:
                return None
        self.last_used = time.monotonic()
        return m[0]

    def read(self, start: int, end: int) -> bytes | None:
        """Bytes [start, end) of the file (offsets within the chunk), or None if not there."""
        m = self._covering(end)
        return None if m is None else m[start:end]

    def view(self, end: int) -> memoryview | None:
        """The mapped file from its start to at least `end`, as a view (no copy), or None if the
        file is not that long. The view keeps its map alive (see the module docstring), so the
        caller should drop it once it has copied what it needs."""
        m = self._covering(end)
        return None if m is None else memoryview(m)

    def unmap(self) -> int:
        """Drop the mapping (freed once no reader holds it); returns the bytes it covered."""
        n = self.mapped_bytes
        self.mapping = None
        return n


def pread_exact(path: str, offset: int, size: int) -> bytes | None:
    """size bytes at offset of the file, or None if the file is gone or shorter."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    return data if len(data) == size else None
