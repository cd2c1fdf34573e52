"""BusyPoll: after a request, the broker's event loop keeps polling its sockets for a short window
(`busy_poll_us`) instead of going to sleep in epoll_wait, for as long as that catches requests.

Why: on a virtual machine an idle vCPU halts at once, and a request to a broker whose loop sleeps
must first bring its vCPU back (~40 us on the VM of docs/benchmarks.md, where `haltpoll`'s
`guest_halt_poll_ns` is 0), then runs on cold caches. A client that sends one request after
another (`Producer.send` in a loop, a request/reply service) pays that on every request. The
client's answer spin (plugins/transport_tcp/blocking.py) keeps the client's vCPU out of halt; this
keeps the broker's. Single sends went from 14.7-20.3k/s to 27.7-33.7k/s on that VM, and the
broker spent less CPU a send, not more ("Busy polling", docs/benchmarks.md).

How: a callback that queues itself again with `call_soon` while the window is open. With a
callback ready the event loop polls with a zero timeout, so each turn is one non-blocking
epoll_wait that takes whatever arrived, then the callback, which yields the vCPU (sched_yield) to
any thread or process waiting for it: the spin uses a vCPU nobody else wants, and a request or
another broker thread never waits behind it.

The window opens at the first turn after a request's work, not at its arrival: it is the wait for
the client's next request, and the broker's own work on this one must not use it up. On the
slower VM of 2026-11-29 a send's work took ~30 µs and the client ~20 µs to send the next one, so a
50 µs window counted from the arrival ran out before the next request often enough (8-19 % of
back-to-back sends came after it) that, in stretches, the credit hit zero and the broker slept
between sends; its wake-ups made every round trip longer, which kept it there. Single sends ran
11-17k/s in some runs and 25-29k/s in others. Counted from the turn after the work, the spin
caught 99-102 % of them ("A broker's start, and the busy-poll window from the end of the work",
docs/benchmarks.md).

When: only while it pays (equeue_core/spin_credit.py). A request that arrives while the loop
spins is a catch (one credit, up to CREDIT_MAX); a window that runs out with nothing is a miss
(MISS_COST credits). At zero credit the broker stops spinning and tries again after RETRY_AFTER
requests. A client that sends back to back keeps it on; a paced stream with gaps longer than the
window, or a broker waiting on its disk (flush=sync), turns it off after a few misses, so it
costs them about one window every RETRY_AFTER requests. A window of 0 turns it off.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from equeue_core.spin_credit import SpinCredit


class BusyPoll:
    """The broker's busy polling (see the module docstring). `poke()` on every request, on the
    loop thread; `window_s` 0 makes it do nothing."""

    __slots__ = ("_loop", "window", "_until", "_renew", "_started", "_spinning", "spin_credit",
                 "spins", "caught", "missed", "spin_s", "_clock", "_give_way")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, window_s: float) -> None:
        """`loop`: the broker's event loop (None only with a window of 0: off)."""
        self._loop = loop
        self.window = max(0.0, window_s) if loop is not None else 0.0
        self._until = 0.0
        self._renew = False
        self._started = 0.0
        self._spinning = False
        self.spin_credit = SpinCredit()
        self.spins = 0  # windows opened
        self.caught = 0  # requests that came while the loop spun
        self.missed = 0  # windows that ran out
        self.spin_s = 0.0  # time spent spinning (an upper bound of the CPU it cost)
        self._clock = time.perf_counter
        self._give_way = os.sched_yield

    def poke(self) -> None:
        """A request arrived: keep (or start) polling, credit allowing, for `window` from the
        loop's next turn, which comes once this request's work (and the rest of the turn's)
        is done."""
        if not self.window:
            return
        if self._spinning:
            self._renew = True
            self.caught += 1
            self.spin_credit.caught()
            return
        if not self.spin_credit.allows():
            return
        self._spinning = True
        self._renew = True
        self._started = self._clock()
        self.spins += 1
        self._loop.call_soon(self._turn)  # type: ignore[union-attr]

    def _turn(self) -> None:
        now = self._clock()
        if self._renew:
            self._renew = False
            self._until = now + self.window
        if now < self._until:
            self._give_way()
            self._loop.call_soon(self._turn)  # type: ignore[union-attr]
            return
        self._spinning = False
        self.missed += 1
        self.spin_credit.missed()
        self.spin_s += now - self._started

    def snapshot(self) -> dict[str, Any]:
        """For BROKER_STATS: the window, and how spinning went since the start."""
        return {"window_us": round(self.window * 1e6), "spins": self.spins, "caught": self.caught,
                "missed": self.missed, "spin_seconds": round(self.spin_s, 6), "credit": self.spin_credit.credit}
