"""The epoch file: which epoch each stretch of this broker's log was written in.

An entry (epoch, start) says: records at positions >= start (up to the next entry's start) were
written by a master of that epoch. A broker appends (epoch, its log end) when it becomes master;
a replica copies its master's entries as it copies the log. Two logs agree up to the end of the
last epoch they share (Kafka's leader epochs, RocketMQ 5's EpochFileCache): a rejoining broker
truncates its log there and copies the rest (replication.py). docs/format.md §"Epoch file" has
the bytes:

    magic "EQEP" u32 LE (0x50455145), version u16 = 1, count u16,
    count x (epoch u64, start position u64), crc32c u32 of everything before it.

Replaced atomically (equeue_core/atomic_file.py): a crash leaves the old or the new list.
"""

from __future__ import annotations

import os
import struct

from equeue_core.atomic_file import write_atomic
from equeue_core.errors import StoreError
from equeue_core.record import crc32c

FILE_NAME = "epochs"
MAGIC = 0x50455145
HEAD = struct.Struct("<IHH")
ENTRY = struct.Struct("<QQ")
CRC = struct.Struct("<I")
MAX_ENTRIES = 65535


class EpochFile:
    """The (epoch, start) list of one data directory; epochs strictly increase, starts never decrease."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        self.entries: list[tuple[int, int]] = self._load()

    def _load(self) -> list[tuple[int, int]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        if len(data) < HEAD.size + CRC.size or CRC.unpack_from(data, len(data) - 4)[0] != crc32c(data[:-4]):
            raise StoreError(f"epoch file {self.path} is damaged (bad crc); restore it or remove it "
                             "and let the broker copy its log again as a replica")
        magic, version, count = HEAD.unpack_from(data)
        if magic != MAGIC or version != 1 or len(data) != HEAD.size + count * ENTRY.size + CRC.size:
            raise StoreError(f"epoch file {self.path} has an unknown layout")
        return [ENTRY.unpack_from(data, HEAD.size + i * ENTRY.size) for i in range(count)]

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def _save(self, entries: list[tuple[int, int]]) -> None:
        if len(entries) > MAX_ENTRIES:
            entries = entries[-MAX_ENTRIES:]
        body = HEAD.pack(MAGIC, 1, len(entries)) + b"".join(ENTRY.pack(e, s) for e, s in entries)
        write_atomic(self.path, body + CRC.pack(crc32c(body)))
        self.entries = list(entries)

    def begin(self, epoch: int, start: int) -> None:
        """Record that epoch `epoch` writes from `start` on (a new master, or a copied entry)."""
        if self.entries and epoch < self.entries[-1][0]:
            raise StoreError(f"epoch {epoch} is older than this log's last epoch {self.entries[-1][0]}")
        if self.entries and epoch == self.entries[-1][0]:
            return
        if self.entries and start < self.entries[-1][1]:
            raise StoreError(f"epoch {epoch} cannot start at {start}, before epoch "
                             f"{self.entries[-1][0]} started ({self.entries[-1][1]})")
        self._save([*self.entries, (epoch, start)])

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Take over a master's list up to the replica's cut (after a truncation)."""
        if entries != self.entries:
            self._save(entries)

    def truncate(self, position: int) -> None:
        """The log was cut at position: drop the epochs that start at or past it (none of
        their records is left)."""
        kept = [(e, s) for e, s in self.entries if s < position]
        if kept != self.entries:
            self._save(kept)


def end_of_epoch(entries: list[tuple[int, int]], epoch: int, log_end: int) -> tuple[int, int] | None:
    """(e, end): the greatest listed epoch e <= `epoch` and where it ends in the log the entries
    describe (the next entry's start, or log_end for the last). None if every epoch is above."""
    found = None
    for i, (e, _s) in enumerate(entries):
        if e > epoch:
            break
        found = (e, entries[i + 1][1] if i + 1 < len(entries) else log_end)
    return found


def divergence_point(mine: list[tuple[int, int]], my_end: int, theirs: list[tuple[int, int]],
                     their_end: int) -> int:
    """The position up to which my log agrees with theirs (their log is the truth). As Kafka's
    OffsetsForLeaderEpoch: they answer for my last epoch with the greatest epoch e they have at
    or below it and where e ends in their log; the logs agree up to the smaller of that and where
    e ends in mine. 0 when no epoch is common (copy everything again)."""
    if not mine:
        # a log written before any epoch: it agrees as far as theirs went without one
        return min(my_end, theirs[0][1] if theirs else their_end)
    found = end_of_epoch(theirs, mine[-1][0], their_end)
    if found is None:
        return 0
    epoch, their_end_of_epoch = found
    mine_found = end_of_epoch(mine, epoch, my_end)
    return min(their_end_of_epoch, my_end if mine_found is None else mine_found[1])
