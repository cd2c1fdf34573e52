"""An in-memory ring of the newest commit-log bytes, so fresh records are read without the page cache.

Byte b of the log lives at ring[b % size]. The ring is cut into pages (slots) of RING_PAGE bytes;
each slot remembers which log page (position // RING_PAGE) it currently holds, and a read checks
that every slot it touches still holds the pages it wants, both before and after copying (the
writer may lap the ring meanwhile: then the read falls back to the mmap'd chunk). Only the writer
thread calls write(); any thread may call read().
"""

from __future__ import annotations

from equeue_core.record import gather_runs

from .constants import RING_PAGE


class Ring:
    __slots__ = ("size", "pages", "buf", "mv", "tags")

    def __init__(self, size: int) -> None:
        self.pages = max(0, size // RING_PAGE)
        self.size = self.pages * RING_PAGE
        self.buf = bytearray(self.size)
        self.mv = memoryview(self.buf)  # the ring never resizes, so one export is safe
        self.tags = [-1] * self.pages

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        """Copy data (the bytes at log position `position`) into the ring."""
        n = len(data)
        size = self.size
        if not size or n == 0:
            return
        first = position // RING_PAGE
        if (position + n - 1) // RING_PAGE == first:
            # Within one page (a single send's record): the general path below for one slot. A
            # page never wraps the ring (its size is a whole number of pages).
            tags = self.tags
            slot = first % self.pages
            whole = position % RING_PAGE == 0 or tags[slot] == first
            tags[slot] = -1
            start = position % size
            self.buf[start:start + n] = data
            if whole:
                tags[slot] = first
            return
        if n > size:  # only the last `size` bytes can stay
            data = memoryview(data)[n - size:]
            position += n - size
            n = size
        tags = self.tags
        pages = self.pages
        first = position // RING_PAGE
        last = (position + n - 1) // RING_PAGE
        # A write that starts inside a page completes that page only if the ring already holds
        # the page's earlier bytes; otherwise (the first write after a restart, or after a write
        # larger than the ring) the page stays unclaimed, so its earlier records are read from the
        # chunk instead of as the zeros (or an older lap) the ring has there.
        whole_first = position % RING_PAGE == 0 or tags[first % pages] == first
        for k in range(first, last + 1):  # claim the slots first: readers of the old pages now miss
            tags[k % pages] = -1
        start = position % size
        if start + n <= size:
            self.buf[start:start + n] = data
        else:
            cut = size - start
            mv = memoryview(data)
            self.buf[start:] = mv[:cut]
            self.buf[:n - cut] = mv[cut:]
        for k in range(first if whole_first else first + 1, last + 1):
            tags[k % pages] = k

    def clear(self) -> None:
        """Forget every page (the log was truncated: positions will be written again)."""
        self.tags = [-1] * self.pages

    def read(self, start: int, end: int) -> bytes | None:
        """The bytes of log positions [start, end), or None if the ring no longer holds them all
        (record.gather_runs over the one span: the same checks and copy as read_runs).

        Every slot the read touches is checked, before and after the copy (a writer that lapped
        us meanwhile). Checking only the first and last slot is not enough: positions are not
        contiguous across a chunk roll (the writer skips the rest of a chunk), so a newer lap can
        land on a middle slot without passing the first one, and the copy would be torn.
        """
        return gather_runs(self.mv, [(start, end)], RING_PAGE, self.tags)

    def read_runs(self, runs: list[tuple[int, int]]) -> bytes | None:
        """The bytes of every log span of `runs` ([start, end), in order) joined, in one call
        (record.gather_runs, with the same checks as read); None if the ring does not hold them
        all. A pull over many topics reads dozens of small spans, and one read each was most of
        the broker's pull."""
        return gather_runs(self.mv, runs, RING_PAGE, self.tags)
