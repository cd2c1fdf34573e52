"""The push Consumer with pulling handler threads: `Consumer(group, broker, pull_in_handler_threads=True)`.

Why: the default push Consumer reads pull answers on the client's loop thread and hands each batch
to a worker thread, so every message wakes two threads, and the worker then waits for the GIL the
loop thread still holds (docs/benchmarks.md, "What the push Consumer costs a message": 115-150 us
of CPU and about 4 context switches a message; p99 0.7-1.3 ms at 5k msg/s, where the
LitePullConsumer has 0.3 ms). Here each of `threads` handler threads is a LitePullConsumer over
its share of the group's queues: it waits in `recv` for its queues' held pulls, runs the handler
on what arrives in that same thread, and polls again. That is one wake-up a message.

Guarantees (those of the push Consumer's clustering mode):
- Per-queue order: a queue belongs to one thread (chosen by a hash of topic and queue id, so it
  never moves between this consumer's threads). That thread hands its messages to the handler in
  offset order, one batch after another.
- At least once: a batch counts as consumed (sent by the auto-commit every `commit_interval`, by
  commit() and by close()) only once every message in it was handled or sent back to the broker.
  A failed message whose send-back fails is handled again in place after `suspend_seconds`, so it
  holds its queue, and the other queues of its thread, until then. A batch cut short by
  stop_handling() is not consumed: the group gets it again.
- Retries: a handler that raises sends the message back (retry topic with a growing delay, then the
  dead-letter topic after `max_reconsume_times`), as the push Consumer does; the group's retry
  topic is consumed with the subscriptions.
- Group membership: the push Consumer's own code (heartbeat, allocation strategy, rebalance) on the
  client's loop thread, which runs no user code. A thread takes an assignment change up within
  POLL_WAIT.
- A slow handler holds only the queues of its own thread; nothing takes them over while it runs.
- A corrupt record stops its queue (paused, loudly) until an admin skips it, as in the default
  Consumer; the thread's other queues go on.

What it does not do (ConfigError): broadcasting, orderly, an async handler, a name server,
`parallel_per_queue` above 1, `consume_timeout` (the thread that runs a handler is the one that
pulls its queues, so no watchdog can move on without it), flow limits (a thread holds one batch
at a time), and the zmq transport (no blocking connections: use the default Consumer).
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from equeue_core.client.consumer import AsyncConsumer, checked_backlog_queues, run_handler
from equeue_core.client.lite_pull import LitePullConsumer, QueueKey, _Membership, _no_handler
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.client.message import ReceivedMessage
from equeue_core.client.pulled_batch import PulledBatch, decoded_chunks, dropped
from equeue_core.errors import ClientClosedError, ConfigError, CorruptRecordError, EQueueError

log = logging.getLogger("equeue.consumer")

POLL_WAIT = 0.25  # seconds a thread waits in poll before it looks at the assignment and commit()
IDLE_WAIT = 1.0  # seconds a thread without queues waits for a rebalance to bring it one
SEND_BACK_TIMEOUT = 30.0  # seconds a send-back may take before it counts as failed
# Consumer options that need the loop thread's pulls, refused by name
LOOP_PULLS_ONLY = ("consume_timeout", "lock_interval", "offset_dir", "flow_max_messages", "flow_max_bytes",
                   "flow_max_span", "nameserver", "threads_min", "max_backlog_bytes")


class _GroupMembership(_Membership):
    """The LitePullConsumer's membership plus the group's retry topic (this consumer sends failed
    messages back, so it reads them again), and a signal to the threads on every change."""

    def __init__(self, *args: Any, changed: threading.Condition, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._changed = changed

    def _all_topics(self) -> dict[str, str]:
        return AsyncConsumer._all_topics(self)

    async def _apply(self, wanted: set[QueueKey]) -> None:
        await super()._apply(wanted)
        with self._changed:
            self._changed.notify_all()


class PullingHandlerConsumer:
    """What `Consumer(group, broker, pull_in_handler_threads=True)` returns; the same calls as
    Consumer (subscribe, start, commit, stop_handling, close, stats); see the module docstring."""

    def __init__(self, group: str, broker: str = "127.0.0.1:10911", *, threads: int = 8,
                 consume_batch_size: int = 1, max_reconsume_times: int = 16, suspend_seconds: float = 1.0,
                 commit_interval: float = 5.0, consume_from: str | int = "last", allocation: str = "averagely",
                 pull_batch: int | None = None, hold_ms: int = 15000, heartbeat_interval: float = 10.0,
                 rebalance_interval: float = 20.0, max_backlog_queues: int | None = None,
                 client_id: str | None = None, mode: str = "clustering", orderly: bool = False,
                 parallel_per_queue: int = 1, corrupt_recheck_max: float = 10.0, **credentials: Any) -> None:
        refused = sorted(set(credentials) & set(LOOP_PULLS_ONLY))
        if mode != "clustering":
            refused.append(f"mode={mode!r}")
        if orderly:
            refused.append("orderly=True")
        if parallel_per_queue != 1:
            refused.append(f"parallel_per_queue={parallel_per_queue}")
        if refused:
            raise ConfigError(f"pull_in_handler_threads does not take {', '.join(refused)}: each handler "
                              "thread pulls its own queues in clustering mode (use the default Consumer)")
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigError(f"threads must be a positive int, not {threads!r}")
        total = checked_backlog_queues(max(16, 2 * threads) if max_backlog_queues is None else max_backlog_queues)
        self.group = group
        self.consume_batch_size = max(1, consume_batch_size)
        self.suspend_seconds = suspend_seconds
        self.corrupt_recheck_max = corrupt_recheck_max
        self._changed = threading.Condition()
        background_loop()
        self._members = _GroupMembership(group, broker, consume_from=consume_from, allocation=allocation,
                                         heartbeat_interval=heartbeat_interval,
                                         rebalance_interval=rebalance_interval, client_id=client_id,
                                         max_reconsume_times=max_reconsume_times,
                                         suspend_seconds=suspend_seconds, changed=self._changed, **credentials)
        # ConfigError here for a transport without blocking connections (zmq)
        self._pollers = [LitePullConsumer(group, broker, pull_batch=pull_batch, hold_ms=hold_ms,
                                          auto_commit_interval=commit_interval,
                                          max_backlog_queues=max(1, math.ceil(total / threads)),
                                          client_id=self._members.client_id, **credentials)
                         for _ in range(threads)]
        self._locks = [threading.Lock() for _ in range(threads)]  # held from a poll until its batch is done
        self._handled = [0] * threads
        self._failed = [0] * threads
        self._corrupt = [0] * threads
        # per thread: its queues stopped at a corrupt record -> [offset, next check, check delay]
        self._parked: list[dict[QueueKey, tuple[int, float, float]]] = [{} for _ in range(threads)]
        self._threads: list[threading.Thread] = []
        self._handler: Callable[..., Any] | None = None
        self._running = False
        self._handing_out = False
        self._closed = False

    @property
    def client_id(self) -> str:
        return self._members.client_id

    @property
    def stats(self) -> dict[str, int]:
        return {"handled": sum(self._handled), "failed": sum(self._failed),
                "sent_back": self._members.stats["sent_back"], "corrupt": sum(self._corrupt),
                "pulls": sum(lp.stats["pulls"] for lp in self._pollers)}

    def assigned_queues(self) -> list[QueueKey]:
        return sorted(self._members.assignment()[1])

    def pull_batches(self) -> dict[QueueKey, int]:
        """The current pull batch size of every queue a thread pulls."""
        return {key: q.batch.size for lp in self._pollers for key, q in list(lp._queues.items())}

    def _owner(self, key: QueueKey) -> int:
        """The index of the thread that pulls this queue, for the consumer's lifetime."""
        return (zlib.crc32(key[0].encode()) + key[1]) % len(self._pollers)

    # ---------------------------------------------------------------- setup

    def subscribe(self, topic: str, expression: str = "*") -> PullingHandlerConsumer:
        self._members.subscribe(topic, expression)
        return self

    def start(self, handler: Callable[[ReceivedMessage], Any]) -> PullingHandlerConsumer:
        """Join the group and start the handler threads (returns at once)."""
        if self._closed:
            raise ClientClosedError("the Consumer is closed")
        if not self._members.subscriptions:
            raise ConfigError("subscribe to at least one topic before start()")
        if inspect.iscoroutinefunction(handler):
            raise ConfigError("pull_in_handler_threads runs a blocking handler; an async one needs the "
                              "default Consumer")
        self._handler = handler
        run_sync(self._members.start(_no_handler))
        self._running = self._handing_out = True
        for i, lp in enumerate(self._pollers):
            lp._follow(self._members, lambda key, i=i: self._owner(key) == i)
            t = threading.Thread(target=self._run, args=(i,), name=f"equeue-{self.group}-pull-{i}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    # ---------------------------------------------------------------- a handler thread

    def _has_queues(self, index: int) -> bool:
        return any(self._owner(key) == index for key in self._members.assignment()[1])

    def _run(self, index: int) -> None:
        lp, lock = self._pollers[index], self._locks[index]
        backoff = 0.0
        while self._running and self._handing_out:
            if not lp._queues and not self._has_queues(index):
                with self._changed:
                    self._changed.wait_for(lambda: not (self._running and self._handing_out)
                                           or self._has_queues(index), IDLE_WAIT)
                continue
            with lock:
                if self._parked[index]:
                    self._check_parked(index, lp)
                try:
                    msgs = lp._poll_batch(POLL_WAIT)
                except ClientClosedError:
                    return
                except CorruptRecordError as e:
                    self._park(index, lp, e)
                    continue
                except EQueueError as e:  # the broker is gone: the next poll connects again
                    backoff = min(5.0, backoff * 2 or 0.2)
                    log.warning("pulls of %s failed: %s; again in %.1fs", self.group, e, backoff)
                    msgs = None
                else:
                    backoff = 0.0
                    if msgs:
                        self._handle(index, lp, msgs)
            if msgs is None:
                self._sleep(backoff)

    def _handle(self, index: int, lp: LitePullConsumer, batch: list[ReceivedMessage] | PulledBatch) -> None:
        """Run the handler over one queue's batch and send back what failed (handled again here
        while a send-back fails); then the batch counts as consumed. A batch cut short stays
        unconsumed: by stop_handling() or close() (the thread stops polling), or by a rebalance
        that took its queue away (the queue goes back to its last consumed offset, so the next
        poll, which drops the queue and commits it, commits none of this batch)."""
        key = lp.last_queue
        members = self._members
        then = members.assignment()  # a new tuple on every rebalance: `is` finds a change in one step

        def keep_going() -> bool:  # before each message: one call, attribute reads while nothing changed
            if not self._handing_out:
                return False
            now = members._published  # what assignment() returns, without a second call a message
            return now is then or key in now[1]

        msgs = batch
        while True:
            failed = self._run_batch(msgs, keep_going)
            if failed is None:
                break
            # (what a tag filter dropped is finished, not handled)
            self._handled[index] += len(msgs) - len(failed) - dropped(msgs)
            self._failed[index] += len(failed)
            msgs = [m for m in failed if not self._send_back(m)]  # those the broker did not take
            if not msgs:
                lp.done()
                return
            if not self._sleep(self.suspend_seconds, keep_going):
                break
        if self._handing_out and key is not None and key in lp._queues:
            lp.seek(key[0], key[1], lp._queues[key].consumed)

    def _run_batch(self, msgs: list[ReceivedMessage] | PulledBatch,
                   keep_going: Callable[[], bool]) -> list[ReceivedMessage] | None:
        """Call the handler over msgs (a PulledBatch decoded a chunk at a time): the messages that
        failed, or None if keep_going() stopped the run first."""
        assert self._handler is not None
        results: list[bool | None] = [None] * len(msgs)
        chunks = decoded_chunks(msgs, self.consume_batch_size, results) if type(msgs) is PulledBatch \
            else ((msgs, results, 0),)
        failed: list[ReceivedMessage] = []
        for chunk, out, base in chunks:
            if not run_handler(self._handler, self.consume_batch_size, chunk, out, base, keep_going=keep_going):
                return None
            if False in results:  # (rare: only then is the chunk looked through)
                failed += [m for i, m in enumerate(chunk, base) if out[i] is False]
        return failed

    def _park(self, index: int, lp: LitePullConsumer, error: CorruptRecordError) -> None:
        """The broker refuses a record of a queue as corrupt: retrying cannot help, so the queue
        stops (loudly) while this thread's other queues go on, as the default Consumer does. What
        was handled below the record is committed now, and nothing of this queue after that, so an
        admin's skip (`equeue groups skip`) is never undone; the thread checks for one with a
        backoff of 1 s doubling to corrupt_recheck_max and resumes the queue there."""
        key = (error.details.get("topic"), error.details.get("queue_id"))
        queue = lp._queues.get(key)  # type: ignore[arg-type]
        if queue is None:
            log.warning("%s: %s (its queue is no longer this consumer's)", self.group, error)
            return
        at = error.offset if error.offset is not None else queue.next_offset
        lp.pause(queue.topic, queue.queue_id)
        self._corrupt[index] += 1
        try:
            lp.commit()
        except EQueueError as e:
            log.warning("%s/%d: committing before the stop failed: %s", queue.topic, queue.queue_id, e)
        log.error("STOPPED %s/%d at offset %d (%s). Skip it with: equeue groups skip %s --topic %s "
                  "--queue %d --offset %d", queue.topic, queue.queue_id, at, error, self.group, queue.topic,
                  queue.queue_id, at)
        self._parked[index][(queue.topic, queue.queue_id)] = (at, time.monotonic() + 1.0, 1.0)

    def _check_parked(self, index: int, lp: LitePullConsumer) -> None:
        """Resume the stopped queues an admin moved the group past (checked when due)."""
        parked = self._parked[index]
        now = time.monotonic()
        for key, (at, due, delay) in list(parked.items()):
            pq = self._members.queues.get(key)
            if key not in lp._queues or pq is None:  # moved to another member meanwhile
                del parked[key]
                continue
            if due > now:
                continue
            try:
                skipped = run_sync(self._members._skipped(pq, at), SEND_BACK_TIMEOUT)
            except Exception as e:  # the loop gone at close, a timeout
                log.warning("%s/%d: checking for a skip failed: %r", key[0], key[1], e)
                skipped = False
            if skipped:  # the membership's _skipped set pq.next_offset to the group's new offset
                del parked[key]
                lp.seek(key[0], key[1], pq.next_offset)
                lp.resume(key[0], key[1])
            else:
                delay = min(self.corrupt_recheck_max, delay * 2)
                parked[key] = (at, now + delay, delay)

    def _send_back(self, m: ReceivedMessage) -> bool:
        try:
            return bool(run_sync(self._members._send_back(m, None), SEND_BACK_TIMEOUT))
        except Exception as e:  # a timeout of run_sync, the loop gone at close
            log.warning("send-back of %s failed: %r", m.msg_id, e)
            return False

    def _sleep(self, seconds: float, keep_going: Callable[[], bool] | None = None) -> bool:
        """Wait up to `seconds`, less if close(), stop_handling() or (keep_going() False) a
        rebalance came; False if one did."""
        deadline = time.monotonic() + seconds

        def go_on() -> bool:
            return self._running and self._handing_out and (keep_going is None or keep_going())

        with self._changed:
            self._changed.wait_for(lambda: not go_on() or time.monotonic() >= deadline, seconds)
        return go_on()

    def _keep_handing_out(self) -> bool:
        return self._handing_out

    # ---------------------------------------------------------------- commits and shutdown

    def commit(self) -> None:
        """Commit every batch handled so far and wait for the broker (waits for batches being
        handled now: at most one a thread)."""
        for lp, lock in zip(self._pollers, self._locks, strict=True):
            with lock:
                lp.commit()

    def stop_handling(self) -> None:
        """Hand no more messages to the handler (thread-safe; a handler may call it). A call in
        progress finishes; its batch stays uncommitted, so the group gets it again."""
        self._handing_out = False
        with self._changed:
            self._changed.notify_all()

    def close(self, drain_timeout: float = 30.0) -> None:
        """Let each thread finish its batch (up to drain_timeout in all), commit what was handled,
        leave the group."""
        if self._closed:
            return
        self._closed = True
        self._running = False
        with self._changed:
            self._changed.notify_all()
        deadline = time.monotonic() + drain_timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("closing %s: a handler is still running after %.0fs; its batch stays "
                            "uncommitted", self.group, drain_timeout)
        for lp in self._pollers:
            lp.close()
        if self._handler is not None:
            run_sync(self._members.close())

    def __enter__(self) -> PullingHandlerConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
