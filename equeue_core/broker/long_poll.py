"""PullHold: pulls that found nothing wait here until their queue gets a message or time runs out.
HeldPull: one such pull, from parking to its answer. LateAnswer: how that answer reaches the
transport.

Arrival wakes the held pulls of that queue at once; nothing polls. The wake-up is a plain call
made inside `notify`, i.e. inside the append that stored the message: a held pull reads and
answers in that same loop turn. (Through a future, its task would resume one turn later and
the transport would write its answer one more turn after that; on a busy two-core machine each
turn is where the process waits for the CPU, and answering in the append's turn cut the median
end-to-end latency to about a third, docs/benchmarks.md.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from equeue_core.frame import Frame

Waker = Callable[[], None]


class PullHold:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], list[Waker]] = {}

    def park(self, topic: str, queue_id: int, woken: Waker) -> None:
        """Call `woken()` at the next arrival on the queue (once; park again to wait again)."""
        self._waiting.setdefault((topic, queue_id), []).append(woken)

    def discard(self, topic: str, queue_id: int, woken: Waker) -> None:
        """Forget a parked waker (its pull timed out or its connection went away)."""
        key = (topic, queue_id)
        waiters = self._waiting.get(key)
        if waiters is not None:
            try:
                waiters.remove(woken)
            except ValueError:
                pass
            if not waiters:
                del self._waiting[key]

    def notify(self, topic: str, queue_id: int) -> None:
        """Wake every pull held on the queue, now, in the order they were parked. A waker must
        not raise (the broker's answer it, errors included)."""
        waiters = self._waiting.pop((topic, queue_id), None)
        if waiters:
            for woken in waiters:
                woken()

    def queues(self) -> list[tuple[str, int]]:
        """The (topic, queue id) pairs pulls are held on now."""
        return list(self._waiting)

    def wake_all(self) -> None:
        for key in list(self._waiting):
            self.notify(*key)

    @property
    def held(self) -> int:
        return sum(len(w) for w in self._waiting.values())


class HeldPull:
    """One pull parked on its queue until an arrival (PullHold.notify) or its deadline (a loop
    timer), then answered once through `late`. `answer(final)` gives the pull's answer frame, or
    None to stay parked (nothing for it yet and not `final`); it must not raise.

    Plain references, all dropped when the pull ends (timer cancelled, waker unparked, done
    callback removed), so an answered pull is freed by reference counting. (Written as closures
    that called each other, every held pull was a reference cycle of some 25 objects left to the
    cyclic GC: at 5k msg/s its collections paused the broker's loop for 0.2-2 ms every few
    milliseconds, and for 20 ms now and then, docs/benchmarks.md.)"""

    __slots__ = ("_hold", "_topic", "_queue_id", "_answer", "late", "_timer")

    def __init__(self, hold: PullHold, topic: str, queue_id: int, deadline: float,
                 answer: Callable[[bool], Frame | None]) -> None:
        """`deadline`: time.monotonic() at which the pull is answered whatever it finds."""
        loop = asyncio.get_running_loop()
        self._hold = hold
        self._topic = topic
        self._queue_id = queue_id
        self._answer = answer
        self.late = LateAnswer(loop)
        self._timer: asyncio.TimerHandle | None = loop.call_later(
            max(0.0, deadline - time.monotonic()), self._attempt, True)
        hold.park(topic, queue_id, self._woken)
        self.late.add_done_callback(self._forget)

    def _woken(self) -> None:
        self._attempt(False)

    def _attempt(self, final: bool) -> None:
        late = self.late
        if late.done():
            return  # cancelled: the connection went away
        frame = self._answer(final)
        if frame is None:
            self._hold.park(self._topic, self._queue_id, self._woken)
            return
        self._end()
        late.remove_done_callback(self._forget)
        late.answer(frame)

    def _forget(self, late: asyncio.Future) -> None:
        if late.cancelled():
            self._end()

    def _end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._hold.discard(self._topic, self._queue_id, self._woken)


class LateAnswer(asyncio.Future):
    """The answer to a request that waits (a held pull), given by `answer(frame)` from a later
    callback. Awaitable like any future, so any transport can await it in a task; a transport
    that calls `listen(callback)` instead (contracts.ImmediateServerHandler) gets the answer
    handed to `callback` synchronously inside `answer`, and writes it in that same loop turn.
    `cancel()` (the connection went away) drops the answer; `answer` after that does nothing."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._listener: Callable[[Frame | None], None] | None = None

    def listen(self, listener: Callable[[Frame | None], None]) -> None:
        self._listener = listener

    def answer(self, frame: Frame | None) -> None:
        if self.done():
            return
        self.set_result(frame)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener(frame)

    def cancel(self, msg: object = None) -> bool:
        self._listener = None  # (it refers back to this answer: no cycle left for the GC)
        return super().cancel(msg)
