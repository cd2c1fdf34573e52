"""HandlerPool: the worker threads that run a consumer's blocking handler over pulled batches.

Why not a ThreadPoolExecutor: handing each pulled batch to an executor cost an asyncio Task, an
executor future, its asyncio wrapper, a shield and a wait_for timer, plus a loop round trip
between two batches of the same queue (the next one started only after the loop saw the first
finish): 50-80 us of CPU a message at a paced 5k msg/s, and the loop-to-worker hand-off was the
largest step of a message's end-to-end time. Here the loop thread appends a batch to its queue's
`waiting` and, if no worker is on that queue, puts the queue on one SimpleQueue; a worker that
takes a queue runs its waiting batches one after the other (the next without going back to the
loop), and goes on to another queue when others are waiting for a thread (fairness).

A queue that needs a thread goes to the worker that went idle last (a stack of sleeping workers,
each woken by its own doorbell), not to whichever waited longest: at a paced rate one or two hot
threads do all the work instead of the batches rotating over all `threads` of them. Measured at
5k msg/s over 4 queues (one message a batch), the submit-to-handler p99 was 1.5-2.2 ms with 4-8
rotating threads and 0.4-0.6 ms with 1-2; see docs/benchmarks.md ("The push Consumer's hand-off").

The doorbell rings at the end of the loop's current turn, not in `submit`: after the pull loop's
own Python for this answer (its next pull written to the connection's buffer), just before the
loop thread lets go of the GIL. Rung at once, the worker woke while the loop thread still held
the GIL, went back to sleep on it, and needed a second wake-up when the loop let go; each wake-up
of a sleeping thread costs the waker ~25 us of CPU on this project's VM (py-spy put an eighth of
the loop thread's samples on the doorbell's release). At 5k msg/s the consumer's CPU a message
fell 124-129 -> 97-107 us and the end-to-end p99 0.97-1.36 -> 0.68-0.88 ms (docs/benchmarks.md,
"The push Consumer's doorbell at the end of the turn").

Workers wake only while they are of use. A handler that only computes holds the GIL, so a second
worker running beside it adds GIL hand-offs and wake-ups, not speed. Draining 300k messages with
a handler that only counts (medians of six drains, alternating with the pool that woke a worker
for every queue with a batch): 4 queues 1.75 -> 2.13 M msg/s, 1000 queues 1.37 -> 1.50 M, 100
topics 1.46 -> 1.55 M (docs/benchmarks.md, "Workers that wake only while they are of use"). At a
fixed pull batch of 125 over 4 queues a batch cost the consumer ~52 us of CPU with `threads=8`
(four workers awake) and ~24 us with `threads=1`.

So the pool keeps at most `busy_limit` workers busy, `min_busy` to begin with (one by default, the
consumer's `threads_min`: `threads_min=threads` keeps the pool as it was); a queue that needs a
thread beyond that waits in line for a busy worker, which takes it once its current batch is
done. The limit goes to `threads` as soon as the handlers are seen to wait rather than compute:
- two batches in a row that each took `block_min_s` (1 ms) or more while the whole process used
  less than a quarter of that time in CPU (the handler slept, waited on I/O or a lock: another
  worker would have run). Two, not one: a worker the kernel puts aside for a while on a busy
  machine looks like that once;
- or queues waited in line while no batch finished for `rescue_s` (10 ms): a handler call that
  does not return soon, whatever it does, never holds the others up longer than that.
It comes back to `min_busy` once no batch has shown either for `calm_s` (2 s). The CPU is the
process's, not the worker's own: a worker that waits for the GIL while the loop thread reads an
answer is not blocked (the process is busy then); one that waits on a socket leaves the process
idle. The cost: two `time.process_time()` calls a batch (~1 us), and handlers that wait run
`min_busy` at a time until two batches (or `rescue_s`) show it, again after each calm spell.

Guarantees:
- A queue's batches run in the order they were submitted, at most `parallel_per_queue` at once
  (1: a queue's messages reach the handler in offset order).
- The loop thread never runs user code; it learns of finished batches through `on_done`, called on
  the loop in finishing order by `collect()`. A worker wakes the loop for that only when it must:
  a batch had a failure (to send back), the queue's pull loop waits for room (`pq.watched`,
  flow control), or the consumer is closing (`wait_idle`); one wake-up covers however many
  batches finished meanwhile. Otherwise the loop collects at its next turn anyway (the consumer
  does before each pull and each commit), so a paced stream costs no extra loop wake-up per batch.
- `count_handled(n)` is called (lock held, on the thread that knows) as soon as a batch's n
  messages are handled, so the consumer's stats do not wait for the collection.
- A batch still running `timeout` seconds after it started is finished at once by `expire()`: its
  unrun and unfinished messages count as failed (`on_done` gets it then, and never again), it
  hands out nothing more, and its queue goes on on another thread.
- Up to `threads` handler calls run at once while the handlers are seen to wait (above); a queue
  in line while a worker could take it waits at most `rescue_s` once no batch finishes.
- No batch of a dropped queue, and none at all once `halt()` was called, is started; a batch
  running then hands out no further message (the call in progress finishes). The worker reads a
  plain flag before each message (`BatchRun.halted`), set by `halt()` and by `expire()`: a
  callable asked before each message (two Python calls) was a tenth of a worker's CPU when
  draining a backlog (docs/benchmarks.md, "The handler's stop check: a flag, not a call, ...").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from equeue_core.client.message import ReceivedMessage
from equeue_core.client.process_queue import ProcessQueue
from equeue_core.client.pulled_batch import PulledBatch, dropped

BLOCK_MIN_S = 0.001  # two batches in a row this long, the process at under a quarter CPU: handlers wait
RESCUE_S = 0.01  # queues in line and no batch finished for this long: workers take them
CALM_S = 2.0  # no sign of waiting handlers for this long: back to one busy worker

Batch = list[ReceivedMessage] | PulledBatch  # messages, or a pull answer decoded by the worker
# run_chunk(msgs, results, stop_on_failure, keep_going, halt): the pool passes keep_going None and
# the BatchRun as `halt` (its `halted` flag, read before each message)
RunChunk = Callable[[Batch, list[Any], bool, Callable[[], bool] | None, "BatchRun"], None]


class BatchRun:
    """One batch on a worker: results[i] is True (handled), False (failed) or None (not run).
    `halted`: hand out no further message of it (set under the pool's lock by halt() or expire()).
    `skipped`: how many of the True ones never reached the handler (a tag filter left them out);
    they are finished, but not counted as handled."""

    __slots__ = ("pq", "msgs", "results", "started", "expired", "halted")

    def __init__(self, pq: ProcessQueue, msgs: Batch) -> None:
        self.pq = pq
        self.msgs = msgs
        self.results: list[bool | None] = [None] * len(msgs)
        self.started = time.monotonic()
        self.expired = False
        self.halted = False

    @property
    def skipped(self) -> int:
        return dropped(self.msgs)


class _Worker:
    """A worker thread's doorbell (a raw lock held while nobody rang) and the queue it is given."""

    __slots__ = ("bell", "job")

    def __init__(self, job: ProcessQueue | None) -> None:
        self.bell = threading.Lock()
        self.bell.acquire()
        self.job = job


class HandlerPool:
    """Up to `threads` worker threads (started as needed) for one consumer; see the module docstring."""

    def __init__(self, threads: int, parallel_per_queue: int, run_chunk: RunChunk,
                 on_done: Callable[[BatchRun], None], loop: asyncio.AbstractEventLoop, name: str,
                 count_handled: Callable[[int], None] = lambda n: None, *,
                 min_busy: int = 1, block_min_s: float = BLOCK_MIN_S, rescue_s: float = RESCUE_S,
                 calm_s: float = CALM_S, on_busy_limit_raised: Callable[[], None] | None = None) -> None:
        self._max_threads = max(1, threads)
        # Workers busy at most before a queue waits in line for one of them (module docstring):
        # `min_busy` (the consumer's threads_min, 1 by default), or `threads` while the handlers
        # are seen to wait
        self._floor = max(1, min(min_busy, self._max_threads))
        self._target = self._floor
        # called (on whichever thread saw it, lock held: it must only schedule) when the busy limit
        # rises to `threads`: the consumer lets more queues catch up then (client/backlog_gate.py)
        self._on_busy_limit_raised = on_busy_limit_raised
        self._block_min_s = block_min_s
        self._rescue_s = rescue_s
        self._calm_s = calm_s
        self._last_wait = 0.0  # time.monotonic() when the handlers were last seen to wait
        self._finished_count = 0  # batches finished so far (lock held)
        self._waits_in_row = 0  # the last finished batches that showed a waiting handler (lock held)
        self._rescue_mark: int | None = None  # _finished_count when the rescue check was armed
        self._parallel = max(1, parallel_per_queue)
        self._run_chunk = run_chunk
        self._on_done = on_done
        self._count_handled = count_handled
        self._halted = False  # halt() was called: no batch starts, running ones stop handing out
        self._loop = loop
        self._name = name
        self._line: deque[ProcessQueue] = deque()  # queues waiting for a thread (lock held)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sleepers: list[_Worker] = []  # idle workers, the one idle the shortest last
        self._running: set[BatchRun] = set()
        self._slots = 0  # queues a worker is on or that wait for one (sum of pq.running)
        self._stuck = 0  # threads still inside a batch that expire() finished
        self._finished: deque[BatchRun] = deque()
        self._wake_pending = False
        self._eager = False  # closing: wake the loop for every finished batch and when idle
        self._idle_event = asyncio.Event()
        self._closed = False
        self._to_ring: list[_Worker] = []  # given a queue this turn, rung by _ring (loop thread)

    # ------------------------------------------------------------ loop thread

    def submit(self, pq: ProcessQueue, msgs: Batch) -> None:
        """Queue a batch of pq's (loop thread)."""
        with self._lock:
            pq.waiting.append(msgs)
            if pq.running < self._parallel and not self._closed:
                self._schedule(pq)

    def _schedule(self, pq: ProcessQueue) -> None:
        """(loop thread, lock held) Give pq to the worker that went idle last, else to a new
        thread (up to the limit), while fewer than `target` workers are busy; else put it in line
        for the next worker that finishes (and watch that line: _rescue)."""
        pq.running += 1
        self._slots += 1
        if self._busy_below_target() and self._can_hire():
            self._hire(pq, self._to_ring_this_turn())
            return
        self._line.append(pq)
        if self._rescue_mark is None and self._can_hire():
            self._rescue_mark = self._finished_count
            self._loop.call_later(self._rescue_s, self._rescue)

    def _busy_below_target(self) -> bool:
        """(lock held) Fewer than `target` workers are busy: a worker is busy from being given a
        queue (taken off `_sleepers`, or started with one) until it sleeps again; a stuck one
        (expired batch) no longer counts."""
        return len(self._threads) - len(self._sleepers) - self._stuck < self._target

    def _can_hire(self) -> bool:
        """(lock held) A worker could take a queue now: one sleeps, or a thread may be started."""
        return bool(self._sleepers) or len(self._threads) < self._max_threads

    def _hire(self, pq: ProcessQueue, to_ring: list[_Worker]) -> None:
        """(lock held, _can_hire) Put a worker on pq: the one that went idle last (added to
        `to_ring`, for the caller to ring), else a new thread."""
        if self._sleepers:
            worker = self._sleepers.pop()
            worker.job = pq
            to_ring.append(worker)
        else:
            t = threading.Thread(target=self._work, args=(_Worker(pq),),
                                 name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _hire_for_line(self, to_ring: list[_Worker]) -> None:
        """(lock held) Workers for the queues in line, up to `target` busy."""
        line = self._line
        while line and self._busy_below_target() and self._can_hire():
            self._hire(line.popleft(), to_ring)

    def _handlers_wait(self) -> None:
        """(lock held) The handlers were seen to wait: up to `threads` workers may be busy."""
        raised = self._target < self._max_threads
        self._target = self._max_threads
        self._last_wait = time.monotonic()
        if raised and self._on_busy_limit_raised is not None:
            self._on_busy_limit_raised()

    def _to_ring_this_turn(self) -> list[_Worker]:
        """(loop thread, lock held) The list of workers _ring rings at the end of this turn."""
        if not self._to_ring:
            self._loop.call_soon(self._ring)
        return self._to_ring

    def _rescue(self) -> None:
        """(loop thread, `rescue_s` after a queue went in line) Queues still in line and no
        batch finished since: the busy workers are held up in their handlers, so the handlers
        wait (see the module docstring) and more workers take the line. Watches again while
        queues are in line and a worker could take them."""
        with self._lock:
            mark, self._rescue_mark = self._rescue_mark, None
            if not self._line or self._closed or self._halted:
                return
            if self._finished_count == mark:
                self._handlers_wait()
                self._hire_for_line(self._to_ring_this_turn())
            if self._line and self._can_hire():
                self._rescue_mark = self._finished_count
                self._loop.call_later(self._rescue_s, self._rescue)

    def _ring(self) -> None:
        """(loop thread, at the end of the turn that gave them a queue) Wake the workers given one."""
        with self._lock:  # shutdown() may ring from another thread
            to_ring, self._to_ring = self._to_ring, []
        for worker in to_ring:
            worker.bell.release()

    def expire(self, timeout: float) -> int:
        """Finish every batch running longer than `timeout` s (loop thread; see the guarantees);
        returns how many."""
        now = time.monotonic()
        expired = []
        with self._lock:
            for run in list(self._running):
                if now - run.started >= timeout:
                    run.expired = run.halted = True
                    self._stuck += 1
                    self._count_handled(run.results.count(True) - run.skipped)
                    self._running.discard(run)
                    expired.append(run)
                    pq = run.pq  # its worker is stuck: the queue goes on on another thread
                    pq.running -= 1
                    self._slots -= 1
                    if pq.waiting and not pq.dropped and not self._closed and not self._halted:
                        self._schedule(pq)
        for run in expired:
            run.results = [r is True for r in run.results]
            self._on_done(run)
        return len(expired)

    @property
    def busy_limit(self) -> int:
        """Workers that may be busy before a queue waits in line for one of them: `min_busy` (1 by
        default), or `threads` while the handlers are seen to wait (module docstring)."""
        return self._target

    @property
    def idle_workers(self) -> int:
        """Worker threads asleep waiting for a queue (read without the lock: a moment stale)."""
        return len(self._sleepers)

    @property
    def busy(self) -> bool:
        """A batch runs or waits for a thread, or a thread is still stuck in an expired batch."""
        return self._slots > 0 or self._stuck > 0

    async def wait_idle(self, timeout: float) -> bool:
        """(closing) Wait until no batch runs or waits for a thread and no thread is stuck in an
        expired one, every finished batch collected; False if `timeout` passed first. From here
        on every finished batch wakes the loop."""
        self._eager = True
        deadline = time.monotonic() + timeout
        self.collect()
        while self.busy:
            self._idle_event.clear()
            if not self.busy:
                break
            try:
                await asyncio.wait_for(self._idle_event.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self.collect()
                return False
            self.collect()
        self.collect()
        return True

    def halt(self) -> None:
        """Hand out nothing more (any thread; a handler may call it): no batch starts from now on,
        and a running one stops before its next message (the call in progress finishes; what is
        not run stays None in its results)."""
        with self._lock:
            self._halted = True
            for run in self._running:
                run.halted = True

    def shutdown(self, wait: bool) -> None:
        """Stop the threads once they finish what they run (wait: join them)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            sleepers, self._sleepers = self._sleepers, []
        self._ring()  # given a queue this turn: they run it out first (a join below would wait for them)
        for worker in sleepers:  # job None: stop
            worker.bell.release()
        if wait:
            for t in threads:
                t.join()

    def collect(self) -> None:
        """On the loop: hand every finished batch to on_done (cheap when there is none)."""
        self._wake_pending = False
        finished = self._finished
        while finished:
            run = finished.popleft()
            if not run.expired:
                self._on_done(run)
        if self._eager and not self.busy:
            self._idle_event.set()

    # ------------------------------------------------------------ worker threads

    def _work(self, me: _Worker) -> None:
        pq = me.job
        while True:
            if pq is not None:
                self._drain(pq)
            with self._lock:
                if self._line:  # queues wait for a thread (after closing too: drain them out)
                    pq = self._line.popleft()
                    continue
                if self._target > self._floor and time.monotonic() - self._last_wait >= self._calm_s:
                    self._target = self._floor  # the handlers have not waited for a while
                if self._closed:
                    return
                me.job = None
                self._sleepers.append(me)
            if self._eager and not self.busy:
                self._wake()
            me.bell.acquire()  # rung by _schedule (me.job set) or by shutdown (me.job None)
            pq = me.job
            if pq is None:
                return

    def _drain(self, pq: ProcessQueue) -> bool:
        """Run pq's waiting batches in order until none is left; True if it stopped early and put
        pq at the back of the line because other queues wait for a thread."""
        turns = 0
        while True:
            with self._lock:
                if not pq.waiting or pq.dropped or self._closed or self._halted:
                    pq.running -= 1
                    self._slots -= 1
                    return False
                if turns and self._line:  # other queues wait: to the back of the line
                    self._line.append(pq)
                    return True
                run = BatchRun(pq, pq.waiting.popleft())
                self._running.add(run)
            turns += 1
            cpu = time.process_time()
            self._run_chunk(run.msgs, run.results, False, None, run)
            results = run.results
            handled = results.count(True)
            took = time.monotonic() - run.started
            # the handler waited (module docstring): the process was mostly idle meanwhile
            waited = took >= self._block_min_s and time.process_time() - cpu < took / 4
            to_ring: list[_Worker] = []
            with self._lock:
                self._finished_count += 1
                self._waits_in_row = self._waits_in_row + 1 if waited else 0
                if self._waits_in_row >= 2:
                    self._handlers_wait()
                    if not self._closed and not self._halted:
                        self._hire_for_line(to_ring)
                expired = run.expired
                if expired:  # expire() finished it and released the queue meanwhile
                    self._stuck -= 1
                else:
                    self._running.discard(run)
                    self._count_handled(handled - run.skipped)
            for worker in to_ring:  # this thread rings them: no loop turn to wait for
                worker.bell.release()
            if expired:
                return False
            self._finished.append(run)
            # after the append: a loop that starts watching pq from now on collects it itself
            if pq.watched or self._eager or handled != len(results):
                self._wake()

    def _wake(self) -> None:
        """Have the loop run collect() (one wake-up for any number of finished batches)."""
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self.collect)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                pass
