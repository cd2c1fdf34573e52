"""Latency fault tolerance: which brokers a producer should avoid for a while (RocketMQ's
MQFaultStrategy / LatencyFaultToleranceImpl).

Every send reports its broker and outcome. A send slower than a step of `LATENCY_STEPS_MS` makes the
broker unavailable for the matching `NOT_AVAILABLE_MS` (RocketMQ's tables: a broker answering in
550 ms is skipped for 30 s). A failed send (transport error: the broker died, the connection broke,
a timeout) makes it unavailable for `failure_base_s * 2**(n-1)` seconds after its n-th failure in a
row, at most `failure_max_s`: a broker that keeps failing is avoided longer and longer, one that
failed once is tried again soon. A success resets the failure count. Unavailable brokers are only
preferred against: when every broker of a topic is unavailable the producer still sends (to the
one whose window ends first), so fault tolerance never turns a slow cluster into a stopped one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LATENCY_STEPS_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)


@dataclass(slots=True)
class _Fault:
    failures: int = 0
    until: float = 0.0  # monotonic time the broker is avoided until


class LatencyFaultTolerance:
    def __init__(self, failure_base_s: float = 1.0, failure_max_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failure_base_s = failure_base_s
        self.failure_max_s = failure_max_s
        self._clock = clock
        self._faults: dict[str, _Fault] = {}

    def succeeded(self, broker: str, latency_s: float) -> None:
        """A send to `broker` answered after latency_s: forget its failures; a slow answer still
        makes it unavailable for RocketMQ's matching window."""
        ms = latency_s * 1000.0
        avoid_ms = 0
        for step, window in zip(reversed(LATENCY_STEPS_MS), reversed(NOT_AVAILABLE_MS), strict=True):
            if ms >= step:
                avoid_ms = window
                break
        if avoid_ms:
            self._faults[broker] = _Fault(0, self._clock() + avoid_ms / 1000.0)
        else:
            self._faults.pop(broker, None)

    def failed(self, broker: str) -> float:
        """A send to `broker` failed: avoid it for a window that doubles with each failure in a
        row. Returns the window in seconds."""
        f = self._faults.setdefault(broker, _Fault())
        f.failures += 1
        window = min(self.failure_max_s, self.failure_base_s * 2 ** (f.failures - 1))
        f.until = max(f.until, self._clock() + window)
        return window

    def has_faults(self) -> bool:
        """False while no broker has failed or been slow: the per-message fast path."""
        return bool(self._faults)

    def available(self, broker: str) -> bool:
        f = self._faults.get(broker)
        return f is None or self._clock() >= f.until

    def unavailable_for(self, broker: str) -> float:
        """Seconds until `broker` is tried again (0 when available)."""
        f = self._faults.get(broker)
        return 0.0 if f is None else max(0.0, f.until - self._clock())

    def preferred(self, brokers: Iterable[str]) -> set[str]:
        """The available brokers among `brokers`; if none is, the one whose window ends first."""
        names = list(brokers)
        ok = {b for b in names if self.available(b)}
        if ok or not names:
            return ok
        return {min(names, key=self.unavailable_for)}

    def forget(self, broker: str) -> None:
        self._faults.pop(broker, None)
