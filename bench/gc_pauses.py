"""The garbage collections of a benchmark's own process over a span of its work.

A collection holds the GIL, so a client's loop thread and handler threads all wait for it. A
consumer that takes on many queues keeps ~25 GC-tracked objects per queue alive (its pull loop's
task and coroutines, the held pull's future and timer, the queue's buffers), and in a fresh
process that growth ends in a full collection of the whole heap during the drain
(docs/benchmarks.md, "Queue count, sixth pass"). Timed with the broker's own hook,
equeue_core/broker/metrics.py `observe_gc_pauses`.
"""

from __future__ import annotations

from equeue_core.broker.metrics import observe_gc_pauses


class GcPauses:
    """This process's garbage collections from construction to stop()."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._stop = observe_gc_pauses(self.pauses.append)

    def stop(self) -> dict:
        """collections, their summed pause and the longest, in ms."""
        self._stop()
        return {"collections": len(self.pauses), "total_ms": round(sum(self.pauses) * 1e3, 2),
                "longest_ms": round(max(self.pauses, default=0.0) * 1e3, 2)}
