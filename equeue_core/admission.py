"""Admission of a connection's requests under a byte budget: what keeps one client from filling the
broker's memory (a kit for server transports; tcp and zmq both use it).

A connection's *charge* is the bytes of its unsent responses (the transport says how many) plus
the bytes of its requests that were read but are not answered yet. A request is started (handed
to the handler) only while the charge stays within the budget; otherwise it waits, in arrival
order, in the connection's backlog, and the transport stops reading that connection while the
backlog is not empty. Requests keep arrival order either way: a request never overtakes one in
the backlog.

Responses are only known once handlers finish, so a burst of requests started in one event-loop
iteration could answer with far more than the budget. Each start in the current iteration
therefore also reserves the connection's *expected response size* (a decaying maximum of its
recent response sizes; an eighth of the budget until the first response is seen): a client that
pipelines pulls and does not read gets about one budget's worth of responses started per
iteration, and none once its unsent bytes pass the budget. A request is charged its body plus
REQUEST_COST bytes for the objects that carry it.

What this guarantees per connection: memory for its requests and responses stays within about
twice the budget plus the responses of handlers that were already running (held pulls answered
later), and at most `max_in_flight` handlers run at once. A request larger than the budget is
still started when nothing else of the connection is running and its unsent bytes are under half
the budget, so it cannot wedge.

What the transport must do: call `retry()` once its unsent bytes for the connection fall back
under half the budget after being over it (TCP: `resume_writing` with the write buffer's high
water mark at half the budget; ZeroMQ: the connection's queued sends drained). Every other
reason a request waits (handlers running, this iteration's reservations) ends by itself.

A request answered within `start` (the transport's synchronous fast path: `start` returns True)
is finished at once: its response is already among the unsent bytes, so it reserves nothing for
the iteration. A transport that answers that way must also call `retry()` after it hands its
buffered responses to the kernel while requests wait (TCP: after each write flush), since no
handler is left running to do it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

MIN_RESPONSE_GUESS = 256
REQUEST_COST = 1024  # charged per request on top of its body: header, frame and task objects


class RequestAdmission(Generic[T]):
    """One connection's admission control (see the module docstring).

    `start(item)` runs a request (creates its handler task) and returns True if it answered it
    already (then the transport never calls `finished` for it); `unsent()` returns the bytes the
    transport holds for this connection that the peer has not taken yet; `unblocked()` is called
    when the backlog has emptied (the transport reads the connection again). The transport calls
    `offer` for each request read, `finished` when a handler is done, `responded` with each
    response's size, and `retry` when its unsent bytes went down (it drained).
    """

    __slots__ = ("budget", "max_in_flight", "_start", "_unsent", "_unblocked", "_loop", "backlog",
                 "running",
                 "charged", "_guess", "_turn", "_turn_reset", "_retry_soon")

    def __init__(self, budget: int, max_in_flight: int, start: Callable[[T], bool | None],
                 unsent: Callable[[], int], unblocked: Callable[[], None]) -> None:
        self.budget = max(1, budget)
        self.max_in_flight = max(1, max_in_flight)
        self._start = start
        self._unsent = unsent
        self._unblocked = unblocked
        self._loop = asyncio.get_running_loop()
        self.backlog: deque[tuple[T, int]] = deque()
        self.running = 0  # handlers started and not finished
        self.charged = 0  # bytes of requests read and not answered (running or in the backlog)
        self._guess = max(MIN_RESPONSE_GUESS, self.budget // 8)
        self._turn = 0  # requests started in this loop iteration
        self._turn_reset = False
        self._retry_soon = False

    @property
    def blocked(self) -> bool:
        """True while requests wait: the transport should not read this connection now."""
        return bool(self.backlog)

    def over_budget(self) -> bool:
        return self._unsent() + self.charged > self.budget

    def offer(self, item: T, size: int) -> None:
        """A request of `size` bytes was read: start it now, or queue it behind the others."""
        size += REQUEST_COST
        self.charged += size
        if self.backlog or not self._may_start(size):
            self.backlog.append((item, size))
            return
        self._begin(item, size)

    def finished(self, size: int) -> None:
        """A started request is answered (or dropped): its bytes leave the charge."""
        self.running -= 1
        self.charged -= size + REQUEST_COST
        if self.backlog:
            self.retry()

    def responded(self, nbytes: int) -> None:
        """A response of `nbytes` was written: it tunes the expected response size."""
        g = self._guess
        self._guess = max(nbytes, g - (g >> 3), MIN_RESPONSE_GUESS)

    def retry(self) -> None:
        """Start what the budget allows now (after a drain, a finished handler, a new iteration)."""
        backlog = self.backlog
        if not backlog:
            return
        while backlog:
            item, size = backlog[0]
            if not self._may_start(size):
                return
            backlog.popleft()
            self._begin(item, size)
        self._unblocked()

    def clear(self) -> None:
        """The connection is gone: forget what waits."""
        self.backlog.clear()

    # ------------------------------------------------------------ internals

    def _may_start(self, size: int) -> bool:
        if self.running >= self.max_in_flight:
            return False
        unsent = self._unsent()
        if self.running == 0 and unsent <= self.budget // 2:
            return True  # always make progress, even for a request bigger than the budget
        charge = unsent + self.charged + self._turn * self._guess
        if charge <= self.budget:
            return True
        if self._turn and not self._retry_soon:
            # Blocked only by this iteration's reservations: look again in the next one.
            self._retry_soon = True
            self._loop.call_soon(self._next_turn)
        return False

    def _next_turn(self) -> None:
        self._retry_soon = False
        self._turn = 0
        self.retry()

    def _begin(self, item: T, size: int) -> None:
        self.running += 1
        if self._start(item):  # answered already: finished, and nothing to reserve
            self.running -= 1
            self.charged -= size
            return
        self.reserve()

    def reserve(self) -> None:
        """A started request answers later: reserve its expected response in this iteration
        (for a transport that started one itself, see `starts_alone`)."""
        self._turn += 1
        if not self._turn_reset:
            self._turn_reset = True
            self._loop.call_soon(self._reset_turn)

    def starts_alone(self) -> bool:
        """True when a request offered now would be started at once because nothing of the
        connection is running or waiting and its unsent bytes are within half the budget (the
        first rule of `offer`). A transport may then run it itself, counting it as `offer` and
        `start` would: `charged` += its size + REQUEST_COST and `running` += 1 before it runs;
        both taken back if it answered within the call, else `reserve()`, and `finished` later."""
        return not self.running and not self.backlog and self._unsent() <= self.budget // 2

    def _reset_turn(self) -> None:
        self._turn_reset = False
        self._turn = 0
