"""The adaptive pull batch: how many messages one pull of a queue asks for.

A fixed small batch costs a round trip per few messages while a queue has a backlog; a fixed large
one is pointless (and holds memory) at a steady trickle. So each queue's batch starts at `floor`,
doubles after every pull that came back full while the broker still had more behind it (a backlog),
up to `ceiling`, and halves after every pull that found the queue caught up (idle), back down to
`floor`. A consumer given an explicit `pull_batch` keeps that fixed size instead.
"""

from __future__ import annotations

PULL_BATCH_FLOOR = 32
PULL_BATCH_CEILING = 1024


class AdaptivePullBatch:
    """The current batch size of one queue (see the module docstring); `peak` is the largest it
    reached, for stats."""

    __slots__ = ("size", "floor", "ceiling", "peak")

    def __init__(self, floor: int = PULL_BATCH_FLOOR, ceiling: int = PULL_BATCH_CEILING) -> None:
        self.floor = max(1, floor)
        self.ceiling = max(self.floor, ceiling)
        self.size = self.floor
        self.peak = self.floor

    def update(self, count: int, next_offset: int, max_offset: int) -> int:
        """After a pull that returned `count` messages, with the queue's next offset to read and
        its end offset: the size of the next pull."""
        if max_offset > next_offset:  # a backlog behind this pull
            if count >= self.size:
                self.size = min(self.ceiling, self.size * 2)
                self.peak = max(self.peak, self.size)
        else:  # caught up
            self.size = max(self.floor, self.size // 2)
        return self.size
