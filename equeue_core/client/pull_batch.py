"""The adaptive pull batch: how many messages one pull of a queue asks for.

A fixed small batch costs a round trip per few messages while a queue has a backlog; a fixed large
one is pointless (and holds memory) at a steady trickle. So each queue's batch starts at `floor`,
doubles after every pull that came back full while the broker still had more behind it (a backlog),
up to `ceiling`, and halves after every pull that found the queue caught up (idle), back down to
`floor`. A queue's first pull may start at its known backlog instead (`expect`: the consumer
learns it with the start offset). A consumer given an explicit `pull_batch` keeps that fixed size instead.
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

    def expect(self, backlog: int, whole: int = 0) -> int:
        """Before the first pull of a queue known to hold `backlog` messages past the start: ask
        for all of them at once (within floor..ceiling) rather than growing from the floor. A
        backlog of at most `whole` is asked for in one pull even past the ceiling: the push
        Consumer's ceiling is half its flow window so that the next pull can be in flight while
        the handler works through this one, and a backlog that fits the window has no next pull
        to overlap, only a second round trip (a pull that costs the consumer ~25-50 µs; over 100
        topics of 750 messages a queue that was 400 pulls of 2000)."""
        self.size = backlog if self.ceiling < backlog <= whole else min(self.ceiling, max(self.floor, backlog))
        self.peak = max(self.peak, self.size)
        return self.size

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
