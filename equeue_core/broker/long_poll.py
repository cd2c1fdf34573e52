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
import logging
import time
from collections.abc import Callable

from equeue_core.frame import Frame

log = logging.getLogger(__name__)

Waker = Callable[[], None]


class PullHold:
    """The held pulls of one broker, by queue (for arrivals) and by hold length (for deadlines).
    Used from one event loop for its whole life (the broker's): the deadline timers are that
    loop's."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], list[Waker]] = {}
        self._expiries: dict[int, _Expiry] = {}  # hold length in ms -> its pulls' deadlines
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the held pulls live on, taken at the first pull and kept: CPython 3.11's
        asyncio.get_running_loop() makes a getpid() system call, ~2 % of the broker's loop
        thread at 5k msg/s when every pull asked for it (docs/benchmarks.md)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

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

    @property
    def deadline_timers(self) -> dict[int, int]:
        """Hold length in ms -> pulls waiting for their deadline under that group's one timer."""
        return {key: len(group.pulls) for key, group in self._expiries.items()}

    def expire_at(self, pull: HeldPull, deadline: float) -> int:
        """Answer `pull` as final (`_attempt(True)`) once `deadline` (time.monotonic()) passes,
        unless `unexpire` comes first. Returns the key `unexpire` needs.

        Pulls are grouped by hold length: within a group each deadline is its parking time plus
        the same hold, so parking order is deadline order and the group's dict (insertion
        ordered) is its queue, the earliest first. One loop timer a group, set for its first
        deadline: a pull answered early only leaves its group's dict, and the timer, when it
        fires, answers what is due and sets itself for the next. A timer of its own for every
        held pull (call_later, then cancel when an arrival answers it) was nearly half of parking
        and answering one: 3.98 -> 2.20 us in a micro-benchmark (docs/benchmarks.md), and at a
        steady rate every message costs one held pull."""
        now = time.monotonic()
        key = round((deadline - now) * 1000)
        group = self._expiries.get(key)
        if group is None:
            group = self._expiries[key] = _Expiry()
        group.pulls[pull] = deadline
        if group.timer is None:
            group.timer = self.loop.call_later(max(0.0, deadline - now), self._expired, key)
        return key

    def unexpire(self, pull: HeldPull, key: int) -> None:
        """Forget `pull`'s deadline (it was answered or cancelled). The group's timer stays: it
        finds the next deadline when it fires, or an empty group and ends it."""
        group = self._expiries.get(key)
        if group is not None:
            group.pulls.pop(pull, None)

    def _expired(self, key: int) -> None:
        """The timer of group `key`: answer every pull due (deadline order), then set the timer
        for the first one left. A timer may fire up to a millisecond early (uvloop counts in ms),
        as a pull's own timer could: such a pull is due."""
        group = self._expiries[key]
        group.timer = None
        pulls = group.pulls
        limit = time.monotonic() + _EARLY
        due = []
        for pull, deadline in pulls.items():
            if deadline > limit:
                break
            due.append(pull)
        for pull in due:
            del pulls[pull]
            try:
                pull.expired()
            except Exception:  # (answers must not raise) the other due pulls are answered anyway
                log.exception("answering a held pull at its deadline failed")
        if group.timer is not None:
            return  # a pull parked while the due ones were answered set it
        if pulls:
            delay = max(0.0, next(iter(pulls.values())) - time.monotonic())
            group.timer = self.loop.call_later(delay, self._expired, key)
        else:
            del self._expiries[key]


_EARLY = 0.001  # how early a deadline may be taken as passed (the loop's timers count in ms)


class _Expiry:
    """The held pulls of one hold length and their deadlines, earliest first, and the one loop
    timer set for the earliest (PullHold.expire_at)."""

    __slots__ = ("pulls", "timer")

    def __init__(self) -> None:
        self.pulls: dict[HeldPull, float] = {}
        self.timer: asyncio.TimerHandle | None = None


class HeldPull:
    """One pull parked on its queue until an arrival (PullHold.notify) or its deadline (PullHold's
    timer of its hold length), then answered once through `late`. `answer(final)` gives the
    pull's answer frame, or None to stay parked (nothing for it yet and not `final`); it must not
    raise.

    Plain references, all dropped when the pull ends (deadline forgotten, waker unparked, done
    callback removed), so an answered pull is freed by reference counting. (Written as closures
    that called each other, every held pull was a reference cycle of some 25 objects left to the
    cyclic GC: at 5k msg/s its collections paused the broker's loop for 0.2-2 ms every few
    milliseconds, and for 20 ms now and then, docs/benchmarks.md.)"""

    __slots__ = ("_hold", "_topic", "_queue_id", "_answer", "late", "_expiry")

    def __init__(self, hold: PullHold, topic: str, queue_id: int, deadline: float,
                 answer: Callable[[bool], Frame | None]) -> None:
        """`deadline`: time.monotonic() at which the pull is answered whatever it finds."""
        self._hold = hold
        self._topic = topic
        self._queue_id = queue_id
        self._answer = answer
        self.late = LateAnswer(hold.loop)
        self._expiry: int | None = hold.expire_at(self, deadline)
        hold.park(topic, queue_id, self._woken)
        self.late.add_done_callback(self._forget)

    def _woken(self) -> None:
        self._attempt(False)

    def expired(self) -> None:
        """Its deadline passed (PullHold's timer, which has forgotten it already)."""
        self._expiry = None
        self._attempt(True)

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
        if self._expiry is not None:
            self._hold.unexpire(self, self._expiry)
            self._expiry = None
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
