"""Consumers: clustering or broadcasting, concurrent or orderly, with retry through the broker.

A clustering consumer heartbeats its group, spreads the group's queues over the members with the
allocation strategy (at start, every rebalance_interval, and at once when the broker says the
group changed), and runs one long-polling pull loop per assigned queue. Pulled messages sit in a
ProcessQueue until handled; the committed offset is the smallest one still in flight, so a slow or
failing message holds it back but never blocks the others. A failed message is sent back to the
broker (retry topic with a growing delay, then the dead-letter topic) and the window moves on.
Orderly consumers lock their queues on the broker and handle one message at a time per queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from equeue_core import record
from equeue_core.broker.topics import RETRY_PREFIX
from equeue_core.client.backlog_gate import DEFAULT_MAX_BACKLOG_BYTES, BacklogGate
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.credentials import credentials
from equeue_core.client.handler_pool import BatchRun, HandlerPool
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.client.message import ReceivedMessage
from equeue_core.client.process_queue import ProcessQueue
from equeue_core.client.pull_batch import PULL_BATCH_CEILING, PULL_BATCH_FLOOR, AdaptivePullBatch
from equeue_core.client.pulled_batch import DECODE_AT_MOST, PulledBatch, ResultsAt, decoded_chunks
from equeue_core.codes import Code, PullStatus
from equeue_core.errors import (
    ClientClosedError,
    ConfigError,
    CorruptRecordError,
    EQueueError,
    TopicNotFoundError,
    TransportError,
)
from equeue_core.frame import Frame
from equeue_core.plugins import get_plugin_manager

log = logging.getLogger("equeue.consumer")

MiB = 1024 * 1024
QueueKey = tuple[str, int]
START_OFFSET_WINDOW = 1024  # queues whose start points one QUERY_OFFSET asks (_apply); broker max 4096


def parse_expression(expression: str) -> tuple[frozenset[str] | None, list[int] | None]:
    """`*` -> (None, None); `a || b` -> ({'a','b'}, [tag_hash(a), tag_hash(b)])."""
    expr = (expression or "*").strip()
    if expr in ("", "*"):
        return None, None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        raise ConfigError(f"subscription expression {expression!r} names no tag")
    return tags, sorted(record.tag_hash(t) for t in tags)


def checked_count(name: str, value: Any, most: int | None = None) -> int:
    """A consumer option that counts something: a whole number >= 1 (and <= `most`), else
    ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most is not None and value > most):
        upto = "" if most is None else f" and <= {most}"
        raise ConfigError(f"{name} must be a whole number >= 1{upto}, not {value!r}")
    return value


def checked_backlog_queues(value: Any) -> int:
    """`max_backlog_queues` of a Consumer or LitePullConsumer: a whole number >= 1 (ConfigError)."""
    return checked_count("max_backlog_queues", value)


def checked_backlog_bytes(value: Any) -> int | None:
    """`max_backlog_bytes` of a Consumer or LitePullConsumer: None (no bound by bytes) or a whole
    number >= 1 (ConfigError)."""
    return None if value is None else checked_count("max_backlog_bytes", value)


def run_handler(handler: Callable[..., Any], batch_size: int, msgs: list[ReceivedMessage],
                results: list[bool | None], base: int = 0, stop_on_failure: bool = False,
                keep_going: Callable[[], bool] | None = None, halt: BatchRun | None = None) -> bool:
    """Call a blocking handler over msgs in this thread: one message a call, or lists of
    `batch_size` when that is above 1. results[base + i] becomes True (handled) or False (it
    raised); a message not run stays None. Before each call the run stops if `halt.halted` is
    True (a flag another thread raises; read as an attribute, no call) or keep_going() says
    stop; with stop_on_failure the first failure stops the run. False if it stopped early. The
    one place both the push Consumer's workers and its pulling handler threads run user code."""
    if batch_size > 1:
        for i in range(0, len(msgs), batch_size):
            if (halt is not None and halt.halted) or (keep_going is not None and not keep_going()):
                return False
            part = msgs[i:i + batch_size]
            try:
                handler(part)
                ok = True
            except Exception:
                log.exception("handler failed on a batch of %d", len(part))
                ok = False
            for j in range(base + i, base + i + len(part)):
                results[j] = ok
            if not ok and stop_on_failure:
                return False
        return True
    for i, m in enumerate(msgs, base):
        if (halt is not None and halt.halted) or (keep_going is not None and not keep_going()):
            return False
        try:
            handler(m)
            results[i] = True
        except Exception as e:
            log.info("handler failed on %s/%d@%d: %r", m.topic, m.queue_id, m.queue_offset, e)
            results[i] = False
            if stop_on_failure:
                return False
    return True


class _BacklogSlot:
    """One of a consumer's backlog turns (client/backlog_gate.py), held by a queue's pull loop from its first
    pull of a known backlog (`ProcessQueue.behind`: the start point or the last answer said more
    is stored) until the pull that caught it up was handled. Only that many queues catch up at
    once; the others wait their turn (in order) before pulling.

    Why: a consumer that catches up on 1000 queues pulled every queue at once. The broker built
    every answer (up to its per-connection budget, 64 MiB) before the socket took the first, and
    the consumer held every queue's answer (up to flow_max_messages each) before a handler thread
    reached it: fresh memory on both ends and page faults instead of work (docs/benchmarks.md,
    "Queue count, third pass"). What a consumer buffers while catching up is now about
    max_backlog_queues * flow_max_messages, whatever the queue count, and while a blocking handler
    only computes, about `max_backlog_bytes` (the gate's limit).

    A caught-up queue never takes a slot, so its held pull (the broker keeps it until messages
    come) never keeps a queue with messages waiting; a queue with a slot asks only for messages
    that are stored (answered at once), so the slot always moves on. The queue that caught up
    sends its held pull at once and gives the slot back from the call that finishes the last
    message it pulled (ProcessQueue.when_idle), without its pull loop waking to do it.
    Orderly consumers do not use slots (a queue there waits for its lock, which may not come)."""

    __slots__ = ("_consumer", "held")

    def __init__(self, consumer: AsyncConsumer) -> None:
        self._consumer = consumer
        self.held = False

    async def take(self) -> None:
        c = self._consumer
        await c._backlog.take()
        self.held = True
        c.stats["backlog_queues_peak"] = c._backlog.peak

    def release(self) -> None:
        if self.held:
            self.held = False
            self._consumer._backlog.release()


class AsyncConsumer:
    """`AsyncConsumer(group, broker="h:p")` consumes from one broker; `AsyncConsumer(group,
    nameserver="h:p,h:p")` gives an AsyncClusterConsumer over every broker of a cluster."""

    def __new__(cls, group: str, broker: str = "127.0.0.1:10911", *, nameserver: str | None = None,
                **options: Any) -> Any:
        if nameserver:
            from equeue_core.client.cluster_consumer import AsyncClusterConsumer

            return AsyncClusterConsumer(group, nameserver, **options)
        return super().__new__(cls)

    def __init__(self, group: str, broker: str = "127.0.0.1:10911", *, mode: str = "clustering",
                 consume_from: str | int = "last", allocation: str = "averagely", orderly: bool = False,
                 consume_batch_size: int = 1, threads: int = 8, threads_min: int = 1,
                 pull_batch: int | None = None, max_reconsume_times: int = 16, consume_timeout: float = 900.0,
                 heartbeat_interval: float = 10.0, rebalance_interval: float = 20.0,
                 commit_interval: float = 5.0, lock_interval: float = 20.0, suspend_seconds: float = 1.0,
                 offset_dir: str = ".equeue-offsets", client_id: str | None = None,
                 flow_max_messages: int = 1000, flow_max_bytes: int = 100 * MiB, flow_max_span: int = 2000,
                 hold_ms: int = 15000, parallel_per_queue: int = 1, max_backlog_queues: int | None = None,
                 max_backlog_bytes: int | None = DEFAULT_MAX_BACKLOG_BYTES,
                 corrupt_recheck_max: float = 10.0, nameserver: None = None,
                 access_key: str | None = None, secret_key: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 curve_server_key: str | None = None, curve_public_key: str | None = None,
                 curve_secret_key: str | None = None) -> None:
        self._credentials = credentials(access_key=access_key, secret_key=secret_key, tls_ca=tls_ca,
                                        tls_cert=tls_cert, tls_key=tls_key, curve_server_key=curve_server_key,
                                        curve_public_key=curve_public_key, curve_secret_key=curve_secret_key)
        if mode not in ("clustering", "broadcasting"):
            raise ConfigError(f"mode must be 'clustering' or 'broadcasting', not {mode!r}")
        if not (consume_from in ("first", "last") or isinstance(consume_from, int)):
            raise ConfigError("consume_from must be 'first', 'last' or a timestamp in ms")
        self.group = group
        self.broker = broker
        self.mode = mode
        self.consume_from = consume_from
        self.strategy = get_plugin_manager().allocation_strategy(allocation)
        self.orderly = orderly
        self.consume_batch_size = max(1, consume_batch_size)
        self.threads = threads
        # handler threads kept busy even while the handler only computes (client/handler_pool.py)
        self.threads_min = checked_count("threads_min", threads_min, max(1, threads))
        # None: adaptive per queue (client/pull_batch.py), grows on a backlog, shrinks when idle
        self.pull_batch = pull_batch
        self.max_reconsume_times = max_reconsume_times
        self.consume_timeout = consume_timeout
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.commit_interval = commit_interval
        self.lock_interval = lock_interval
        # How long a granted lock is trusted without renewal (RocketMQ: 30 s with 20 s renewals);
        # the broker keeps it for queue_lock_expiry_s (60 s), so we always stop first.
        self.lock_max_live = lock_interval * 1.5
        self.suspend_seconds = suspend_seconds
        self.offset_dir = offset_dir
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.flow = (flow_max_messages, flow_max_bytes, flow_max_span)
        self.hold_ms = hold_ms
        self.parallel_per_queue = max(1, parallel_per_queue)
        max_backlog_queues = checked_backlog_queues(max(16, 2 * threads) if max_backlog_queues is None
                                                    else max_backlog_queues)
        # How many queues catch up on a backlog at once (_BacklogSlot, BacklogGate); caught-up
        # queues pull freely. The gate follows the handler pool's busy limit from start() on.
        self.max_backlog_queues = max_backlog_queues
        self.max_backlog_bytes = checked_backlog_bytes(max_backlog_bytes)
        self._backlog = BacklogGate(max_backlog_queues, self.max_backlog_bytes, flow_max_messages,
                                    flow_max_bytes)
        self.subscriptions: dict[str, str] = {}
        self._filters: dict[str, tuple[frozenset[str] | None, list[int] | None]] = {}
        self.queues: dict[QueueKey, ProcessQueue] = {}
        self._tasks: dict[QueueKey, list[asyncio.Task]] = {}
        self._background: list[asyncio.Task] = []
        self._work: set[asyncio.Future] = set()
        # an async handler's run (a task) -> the task awaiting it (a _consume or an orderly loop)
        self._handler_runs: dict[asyncio.Future, asyncio.Task | None] = {}
        self._handler: Callable[..., Any] | None = None
        self._is_async = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # orderly runs and retries
        self._batches: HandlerPool | None = None  # concurrent consumer, blocking handler
        self._conn: BrokerConnection | None = None
        self._id_prefix = ""
        self._members: list[str] = []
        self._rebalance_lock = asyncio.Lock()
        self._rebalance_soon: asyncio.TimerHandle | None = None
        self._running = False
        # False once stop_handling() or close() was called: no message is handed to the handler
        # any more (read by worker threads before each call), so what stays unhandled stays
        # uncommitted.
        self._handing_out = False
        self.stats = {"handled": 0, "failed": 0, "sent_back": 0, "pulls": 0, "corrupt": 0, "pull_batch_peak": 0,
                      "backlog_queues_peak": 0}
        self.corrupt_recheck_max = corrupt_recheck_max  # at most this many s between checks for a skip
        # Set by a ClusterConsumer (client/cluster_consumer.py) that runs this consumer as its part
        # on one broker: the coordinator then decides the queues (over every broker) and is told
        # of a pull failure so it refreshes the routes at once.
        self.coordinator: Any = None

    # ---------------------------------------------------------------- setup

    def subscribe(self, topic: str, expression: str = "*") -> AsyncConsumer:
        self._filters[topic] = parse_expression(expression)
        self.subscriptions[topic] = expression or "*"
        return self

    def _all_topics(self) -> dict[str, str]:
        topics = dict(self.subscriptions)
        if self.mode == "clustering":
            topics[RETRY_PREFIX + self.group] = "*"
        return topics

    async def start(self, handler: Callable[..., Any]) -> AsyncConsumer:
        if not self.subscriptions:
            raise ConfigError("subscribe to at least one topic before start()")
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler)
        if not self._is_async:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix=f"equeue-{self.group}")
            if not self.orderly:
                self._batches = HandlerPool(self.threads, self.parallel_per_queue, self._run_chunk,
                                            self._batch_done, asyncio.get_running_loop(), f"equeue-{self.group}-batch",
                                            self._count_handled, min_busy=self.threads_min,
                                            on_busy_limit_raised=self._backlog.wake_soon)
                pool = self._batches
                self._backlog.busy_limit = lambda: pool.busy_limit
        self._conn = await BrokerConnection(self.broker, on_push=self._on_push, **self._credentials).connect()
        info = (await self._conn.request(Code.BROKER_INFO)).header
        self._id_prefix = _id_prefix(info["address"])
        self._running = True
        self._handing_out = True
        await self._heartbeat()
        if self.coordinator is None:
            await self.rebalance()
        loop = asyncio.get_running_loop()
        self._background = [loop.create_task(self._every(self.heartbeat_interval, self._heartbeat)),
                            loop.create_task(self._every(self.commit_interval, self.commit))]
        if self.coordinator is None:  # a coordinator rebalances its parts on timers of its own
            self._background.append(loop.create_task(self._every(self.rebalance_interval, self.rebalance)))
        if self.orderly:
            self._background.append(loop.create_task(self._lock_loop()))
        if self._batches is not None:
            self._background.append(loop.create_task(self._every(self._expiry_check_interval(), self._expire_stuck)))
        return self

    def stop_handling(self) -> None:
        """Hand no more messages to the handler (thread-safe; a handler may call it). A call in
        progress finishes; messages not handed out stay uncommitted, so the group gets them
        again. For a consumer that stops early (a count reached); call close() next."""
        self._stop_handing_out()

    def _stop_handing_out(self) -> None:
        """(any thread) From now on no message reaches the handler: the flag the other paths read
        before each call, and the handler pool's halt (its workers read their batch's flag)."""
        self._handing_out = False
        if self._batches is not None:
            self._batches.halt()

    def _keep_handing_out(self) -> bool:
        return self._handing_out

    async def _every(self, interval: float, fn: Callable[[], Any]) -> None:
        while self._running:
            await asyncio.sleep(interval)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except EQueueError as e:
                log.warning("%s: %s", getattr(fn, "__name__", fn), e)
            except Exception:
                log.exception("%s failed", getattr(fn, "__name__", fn))

    def _on_push(self, frame: Frame) -> None:
        if frame.code == Code.GROUP_CHANGED and self._running:
            self.rebalance_soon(0.0)

    def rebalance_soon(self, delay: float = 0.0) -> None:
        """Rebalance `delay` seconds from now (a later call moves it). A part of a cluster consumer
        asks its coordinator, which rebalances in a task of its own: a rebalance may close this
        part, and a part's close waits for the part's own tasks, never for itself."""
        if self.coordinator is not None:
            self.coordinator.rebalance_soon(delay)
            return
        loop = asyncio.get_running_loop()
        if self._rebalance_soon is not None:
            self._rebalance_soon.cancel()
        self._rebalance_soon = loop.call_later(delay, lambda: loop.create_task(self._safe_rebalance()))

    async def _safe_rebalance(self) -> None:
        try:
            await self.rebalance()
        except EQueueError as e:
            log.warning("rebalance failed: %s", e)

    async def _heartbeat(self) -> None:
        assert self._conn is not None
        h = (await self._conn.request(Code.HEARTBEAT, {
            "client_id": self.client_id, "group": self.group, "mode": self.mode,
            "subscriptions": self._all_topics(),
            "queues": [[t, q] for t, q in sorted(self.queues)]})).header
        members = h.get("members", [])
        if members != self._members and self._members:
            self._members = members
            self.rebalance_soon(0.0)
        self._members = members

    # ---------------------------------------------------------------- rebalance

    async def rebalance(self) -> None:
        """Recompute this consumer's queues; stop the ones it lost, start the ones it gained."""
        if not self._running:
            return
        if self.coordinator is not None:
            await self.coordinator.rebalance()
            return
        assert self._conn is not None
        async with self._rebalance_lock:
            if not self._running:  # close() came first (it waited for the rebalance before this one)
                return
            if self.mode == "clustering":
                self._members = (await self._conn.request(Code.GROUP_MEMBERS, {"group": self.group})).header["members"]
                if self.client_id not in self._members:
                    await self._heartbeat()
            wanted: set[QueueKey] = set()
            topics = list(self._all_topics())
            # every topic's route at once (pipelined): 100 topics cost one round trip, not 100
            routes = await asyncio.gather(*(self._conn.request(Code.ROUTE, {"topic": t}) for t in topics),
                                          return_exceptions=True)
            for topic, route in zip(topics, routes, strict=True):
                if isinstance(route, TopicNotFoundError):
                    continue
                if isinstance(route, BaseException):
                    raise route
                queues = [(topic, q) for q in range(route.header["queues"])]
                if self.mode == "broadcasting":
                    wanted.update(queues)
                else:
                    wanted.update(self.strategy(self.client_id, queues, self._members or [self.client_id]))
            await self._apply(wanted)

    async def _apply(self, wanted: set[QueueKey]) -> None:
        """Stop the queues not wanted any more, start the new ones (caller holds the rebalance lock)."""
        for key in sorted(set(self.queues) - wanted):
            await self._drop_queue(key)
        added = sorted(wanted - set(self.queues))
        # The start points are asked START_OFFSET_WINDOW queues per request (one round trip for
        # up to 1024 queues, not one each); the queues' pull loops then start one after another.
        for i in range(0, len(added), START_OFFSET_WINDOW):
            window = added[i:i + START_OFFSET_WINDOW]
            points = await self._start_points(window)
            for key, (offset, end) in zip(window, points, strict=True):
                self._add_queue(key, offset, end)
        if added or len(wanted) != len(self.queues):
            log.info("%s now consumes %d queues", self.client_id, len(self.queues))
        if added and self.orderly:
            await self._lock_all()
        if added:
            await self._heartbeat()

    async def _start_offset(self, topic: str, queue_id: int) -> int:
        return (await self._start_points([(topic, queue_id)]))[0][0]

    async def _start_points(self, keys: list[QueueKey]) -> list[tuple[int, int]]:
        """Per queue: (the offset this consumer starts it at, its end offset when asked); all of
        them asked of the broker in one QUERY_OFFSET."""
        assert self._conn is not None
        answer = await self._conn.request(Code.QUERY_OFFSET, {"group": self.group,
                                                              "queues": [[t, q] for t, q in keys]})
        asked = answer.header["points"]
        local = self._load_local_offsets() if self.mode == "broadcasting" else {}
        return [await self._start_from(t, q, committed, lo, hi, local.get(f"{t}:{q}"))
                for (t, q), (committed, lo, hi) in zip(keys, asked, strict=True)]

    async def _start_from(self, topic: str, queue_id: int, committed: int | None, lo: int, hi: int,
                          local: int | None) -> tuple[int, int]:
        """Where a queue starts: the group's committed offset (broadcasting: this consumer's own
        local one), else `consume_from`; never below the queue's min offset."""
        mine = local if self.mode == "broadcasting" else committed
        if mine is not None:
            return max(int(mine), lo), hi
        if topic.startswith(RETRY_PREFIX) or self.consume_from == "first":
            return lo, hi
        if self.consume_from == "last":
            return hi, hi
        assert self._conn is not None
        at = await self._conn.request(Code.OFFSET_FOR_TIME, {"topic": topic, "queue_id": queue_id,
                                                             "ts_ms": int(self.consume_from)})
        return at.header["offset"], hi

    def _add_queue(self, key: QueueKey, offset: int, end: int) -> None:
        """Take a queue at `offset`; its first pull asks for the backlog seen then (`end - offset`,
        within the adaptive batch's bounds) instead of the floor, so a queue holding 100 messages
        is read in one pull, not four (32, 64, then the rest)."""
        topic, q = key
        pq = ProcessQueue(topic, q, offset)
        pq.behind = end > offset
        if self.pull_batch is None:  # a backlog within the queue's flow window: one pull
            self._pull_batch_of(pq).expect(end - offset, min(PULL_BATCH_CEILING, self.flow[0]))
        pq.last_committed = pq.next_offset
        self.queues[key] = pq
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._pull_loop(pq))]
        if self.orderly:
            tasks.append(loop.create_task(self._orderly_loop(pq)))
        self._tasks[key] = tasks

    async def _drop_queue(self, key: QueueKey) -> None:
        pq = self.queues.pop(key)
        pq.dropped = True
        pq.wake()
        tasks = self._tasks.pop(key, [])
        for t in tasks[:1]:  # the pull loop stops now; an orderly handler finishes its message
            t.cancel()
        if self.orderly and len(tasks) > 1:
            try:
                await asyncio.wait_for(asyncio.shield(tasks[1]), 10)
            except (TimeoutError, asyncio.CancelledError):
                tasks[1].cancel()
        await self._commit_queues([pq])
        if self.orderly and self._conn is not None:
            await self._conn.request(Code.UNLOCK_QUEUES, {"group": self.group, "client_id": self.client_id,
                                                          "queues": [[pq.topic, pq.queue_id]]})

    async def _lock_loop(self) -> None:
        """Renew locks every lock_interval; while a queue of ours is still locked by its previous
        owner (which unlocks as it lets go), retry every second instead."""
        while self._running:
            waiting = any(not pq.locked for pq in self.queues.values())
            await asyncio.sleep(min(1.0, self.lock_interval) if waiting else self.lock_interval)
            try:
                await self._lock_all()
            except asyncio.CancelledError:
                raise
            except EQueueError as e:
                log.warning("locking queues failed: %s", e)

    async def _lock_all(self) -> None:
        if not self.queues or self._conn is None:
            return
        asked = time.monotonic()
        try:
            h = (await self._conn.request(Code.LOCK_QUEUES, {
                "group": self.group, "client_id": self.client_id,
                "queues": [[t, q] for t, q in self.queues]})).header
        except TransportError:
            self._locks_lost()
            raise
        locked = {(t, q) for t, q in h["locked"]}
        for key, pq in self.queues.items():
            if key in locked:
                # Trusted for lock_max_live from when we asked (the broker keeps it longer), so
                # a consumer cut off from the broker stops before anyone else may start.
                pq.lock_until = asked + self.lock_max_live
                if not pq.locked:
                    pq.locked = True
                    pq.wake()
            elif pq.locked:
                log.warning("lost the lock of %s/%d", *key)
                pq.lose_lock()

    def _locks_lost(self) -> None:
        """The connection dropped: the broker released every lock it held for us, so stop
        handling at once (another consumer may take the queues now) and lock again later."""
        if not self.orderly:
            return
        for key, pq in self.queues.items():
            if pq.locked:
                log.warning("connection lost: the lock of %s/%d is gone", *key)
                pq.lose_lock()

    # ---------------------------------------------------------------- pulling

    async def _pull_loop(self, pq: ProcessQueue) -> None:
        slot = _BacklogSlot(self)
        try:
            await self._pull_queue(pq, slot)
        finally:
            pq.when_idle(None)
            slot.release()

    async def _pull_queue(self, pq: ProcessQueue, slot: _BacklogSlot) -> None:
        assert self._conn is not None
        tags, hashes = self._filters.get(pq.topic, (None, None))
        batch = self._pull_batch_of(pq)
        header: dict[str, Any] = {"group": self.group, "topic": pq.topic, "queue_id": pq.queue_id,
                                  "max_count": batch.size, "hold_ms": self.hold_ms}
        if hashes:
            header["tags"] = hashes
        backoff = 0.0
        while self._running and not pq.dropped:
            # drop the last answer before waiting again: a caught-up queue waits in a held pull
            # for up to hold_ms, and its last answer's bytes would stay alive that long (1000
            # queues: ~90 MB held, and every new answer in fresh pages)
            resp = pulled = None
            self._collect()
            if pq.is_full(*self.flow) or (self.orderly and not pq.holds_lock()):
                await pq.wait_change(0.5, self._collect)
                continue
            if not self.orderly:
                if pq.behind:
                    if not slot.held:
                        await slot.take()
                        continue  # look again: the queue may be gone or full by now
                    pq.when_idle(None)  # behind again before its last pull was handled: keep it
                elif slot.held:
                    # caught up: the slot goes once what it pulled is handled, and the held pull
                    # leaves now instead of after that
                    pq.when_idle(slot.release)
            epoch = pq.lock_epoch
            self.stats["pulls"] += 1
            try:
                if pq.needs_offset:  # the lock came back: someone else may have moved the queue on
                    pq.next_offset = await self._start_offset(pq.topic, pq.queue_id)
                    pq.last_committed = pq.next_offset
                    pq.needs_offset = False
                header["offset"] = pq.next_offset
                header["max_count"] = batch.size
                resp = await self._conn.request(Code.PULL, header, timeout=self.hold_ms / 1000 + 15)
            except asyncio.CancelledError:
                raise
            except ClientClosedError:
                return
            except CorruptRecordError as e:
                await self._park(pq, e)
                continue
            except EQueueError as e:
                if isinstance(e, TransportError):
                    self._locks_lost()
                    if self.coordinator is not None:
                        self.coordinator.broker_failed(self)
                backoff = min(5.0, backoff * 2 or 0.2)
                log.warning("pull %s/%d failed: %s; retrying in %.1fs", pq.topic, pq.queue_id, e, backoff)
                await asyncio.sleep(backoff)
                continue
            backoff = 0.0
            if pq.dropped:
                return
            if pq.lock_epoch != epoch:  # pulled under a lock that is gone since: void
                continue
            h = resp.header
            pq.behind = h.get("max_offset", 0) > h["next_offset"]
            if self.pull_batch is None and "max_offset" in h:
                if batch.update(h["count"], h["next_offset"], h["max_offset"]) > self.stats["pull_batch_peak"]:
                    self.stats["pull_batch_peak"] = batch.size
            if h["status"] == PullStatus.OFFSET_RESET:
                log.warning("offset %d of %s/%d is out of range; moving to %d",
                            pq.next_offset, pq.topic, pq.queue_id, h["next_offset"])
                pq.next_offset = h["next_offset"]
                continue
            if h["count"]:
                # the answer stays bytes until it is handed out (client/pulled_batch.py), so no
                # objects per message wait in flight: a worker decodes a chunk at a time and
                # applies the tag filter to it (decoded_chunks), an async handler's run on the
                # loop too, the orderly loop DECODE_AT_MOST at a time (_decode_pending)
                pulled = PulledBatch(resp.body, self._id_prefix, tags)
                self._backlog.measured(len(resp.body), h["count"])
                pq.next_offset = h["next_offset"]
                if len(pulled):
                    pq.add_batch(pulled)
                    if self.orderly:
                        pq.wake()
                    else:
                        self._dispatch(pq, pulled)
            else:
                pq.next_offset = h["next_offset"]

    def _pull_batch_of(self, pq: ProcessQueue) -> AdaptivePullBatch:
        """The queue's pull batch: fixed at `pull_batch` if one was given, else adaptive between
        32 and 1024, and never above half of flow_max_messages: one pull cannot overrun flow
        control, and a full pull leaves room for the next one to be in flight while the handler
        works through it (at the whole window, pulling and handling took turns). The one
        exception is a queue's first pull of a known backlog that fits the window (_add_queue):
        it takes the whole backlog, as there is no next pull to overlap."""
        if pq.pull_batch is None:
            if self.pull_batch is not None:
                pq.pull_batch = AdaptivePullBatch(self.pull_batch, self.pull_batch)
            else:
                ceiling = min(PULL_BATCH_CEILING, max(1, self.flow[0] // 2))
                pq.pull_batch = AdaptivePullBatch(min(PULL_BATCH_FLOOR, ceiling), ceiling)
        return pq.pull_batch

    def pull_batches(self) -> dict[QueueKey, int]:
        """The current pull batch size of every assigned queue."""
        return {key: self._pull_batch_of(pq).size for key, pq in list(self.queues.items())}

    async def _park(self, pq: ProcessQueue, error: CorruptRecordError) -> None:
        """The broker refuses a record of this queue as corrupt: retrying cannot help, so the
        queue stops (loudly) instead of pulling it again and again; the consumer's other queues go
        on. It first lets the messages in flight below the record finish and commits them, then
        logs STOPPED with the command that skips the record, and from then on commits nothing for
        this queue (so it never undoes a skip). An admin moves the group past the record
        (`equeue groups skip`, AdminClient.skip_record); the queue sees the group's new offset
        (checked with a backoff of 1 s doubling to corrupt_recheck_max) and resumes there."""
        assert self._conn is not None
        at = error.offset if error.offset is not None else pq.next_offset
        pq.parked_at = at
        self.stats["corrupt"] += 1
        log.error("%s/%d: %s. Retrying cannot help: this queue stops once its %d messages in flight "
                  "are done", pq.topic, pq.queue_id, error, pq.count)
        while self._running and not pq.dropped and pq.count:
            await pq.wait_change(1.0, self._collect)
        if not self._running or pq.dropped:
            return
        if not await self._skipped(pq, at):
            pq.parked_at = None
            try:
                await self._commit_queues([pq])
            except EQueueError as e:
                log.warning("%s/%d: committing before the stop failed: %s", pq.topic, pq.queue_id, e)
            finally:
                pq.parked_at = at
        log.error("STOPPED %s/%d at offset %d (corrupt record). Skip it with: equeue groups skip %s "
                  "--topic %s --queue %d --offset %d", pq.topic, pq.queue_id, at, self.group, pq.topic,
                  pq.queue_id, at)
        delay = 1.0
        while self._running and not pq.dropped:
            if await self._skipped(pq, at):
                return
            await pq.wait_change(delay, self._collect)
            delay = min(self.corrupt_recheck_max, delay * 2)

    async def _skipped(self, pq: ProcessQueue, at: int) -> bool:
        """If the group's offset moved past `at` (an admin's skip), resume the queue there."""
        assert self._conn is not None
        try:
            if self.mode == "broadcasting":
                now = self._load_local_offsets().get(f"{pq.topic}:{pq.queue_id}")
            else:
                now = (await self._conn.request(Code.QUERY_OFFSET, {
                    "group": self.group, "topic": pq.topic, "queue_id": pq.queue_id})).header["offset"]
        except asyncio.CancelledError:
            raise
        except EQueueError as e:
            log.warning("%s/%d: checking for a skip failed: %s", pq.topic, pq.queue_id, e)
            return False
        if now is None or now <= at:
            return False
        log.warning("%s/%d: offset %d was skipped; resuming at %d", pq.topic, pq.queue_id, at, now)
        pq.next_offset = pq.last_committed = now
        pq.parked_at = None
        return True

    # ---------------------------------------------------------------- handling

    def _run_chunk(self, msgs: list[ReceivedMessage] | PulledBatch, results: list[bool | None],
                   stop_on_failure: bool = False, keep_going: Callable[[], bool] | None = None,
                   halt: BatchRun | None = None) -> None:
        """Runs on a worker thread: call the handler, record success or failure per message
        (orderly: stop at the first failure, leaving the rest unrun). Before each call,
        keep_going() may say stop (an orderly lock is gone) and `halt.halted` (the handler
        pool's flag) may be raised: the rest stays unrun (None). A PulledBatch is decoded a chunk
        at a time, just before its messages are handed out."""
        if type(msgs) is PulledBatch:
            for chunk, out, base in decoded_chunks(msgs, self.consume_batch_size, results):
                if not self._run_messages(chunk, out, base, stop_on_failure, keep_going, halt):
                    return
            return
        self._run_messages(msgs, results, 0, stop_on_failure, keep_going, halt)

    def _run_messages(self, msgs: list[ReceivedMessage], results: list[bool | None] | ResultsAt, base: int,
                      stop_on_failure: bool, keep_going: Callable[[], bool] | None,
                      halt: BatchRun | None = None) -> bool:
        """_run_chunk over msgs, whose results start at results[base]; False if it stopped early."""
        assert self._handler is not None
        return run_handler(self._handler, self.consume_batch_size, msgs, results, base, stop_on_failure,
                           keep_going, halt)

    async def _run_chunk_async(self, msgs: list[ReceivedMessage] | PulledBatch, results: list[bool | None],
                               stop_on_failure: bool = False,
                               keep_going: Callable[[], bool] | None = None) -> None:
        """_run_chunk for an async handler, on the loop; a PulledBatch is decoded a chunk at a
        time (and tag-filtered), as the workers do."""
        if type(msgs) is PulledBatch:
            for chunk, out, base in decoded_chunks(msgs, self.consume_batch_size, results):
                if not await self._run_messages_async(chunk, out, base, stop_on_failure, keep_going):
                    return
            return
        await self._run_messages_async(msgs, results, 0, stop_on_failure, keep_going)

    async def _run_messages_async(self, msgs: list[ReceivedMessage], results: list[bool | None] | ResultsAt,
                                  base: int,
                                  stop_on_failure: bool, keep_going: Callable[[], bool] | None) -> bool:
        """_run_chunk_async over msgs, whose results start at results[base]; False if it stopped
        early."""
        handler = self._handler
        assert handler is not None
        step = self.consume_batch_size
        for i in range(0, len(msgs), step):
            if keep_going is not None and not keep_going():
                return False
            part = msgs[i:i + step]
            try:
                await handler(part if step > 1 else part[0])
                ok = True
            except Exception as e:
                log.info("handler failed: %r", e)
                ok = False
            for j in range(base + i, base + i + len(part)):
                results[j] = ok
            if not ok and stop_on_failure:
                return False
        return True

    async def _handle(self, msgs: list[ReceivedMessage] | PulledBatch, stop_on_failure: bool = False,
                      keep_going: Callable[[], bool] | None = None) -> list[bool | None]:
        """Run the handler over msgs: True handled, False failed, None not run (after a failure,
        with stop_on_failure, or once keep_going() said stop). A message not finished within
        consume_timeout counts as failed."""
        results: list[bool | None] = [None] * len(msgs)
        if self._is_async:
            work: asyncio.Future = asyncio.ensure_future(
                self._run_chunk_async(msgs, results, stop_on_failure, keep_going))
            self._handler_runs[work] = asyncio.current_task()  # close() from the handler: see there
            work.add_done_callback(self._handler_runs.pop)
        else:
            work = asyncio.get_running_loop().run_in_executor(self._pool, self._run_chunk, msgs, results,
                                                              stop_on_failure, keep_going)
        try:
            await asyncio.wait_for(asyncio.shield(work), self.consume_timeout)
        except TimeoutError:
            log.warning("handler ran past consume_timeout (%.0fs): unfinished messages count as failed",
                        self.consume_timeout)
            if stop_on_failure:
                first = next((i for i, r in enumerate(results) if r is None), None)
                if first is not None:
                    results[first] = False
            else:
                results = [r is True for r in results]
        return results

    def _dispatch(self, pq: ProcessQueue, msgs: list[ReceivedMessage] | PulledBatch) -> None:
        """Queue a pulled batch for handling. At most `parallel_per_queue` batches of one queue
        run at once (1 by default: a queue's messages reach the handler in offset order while
        different queues run in parallel on the worker pool). A blocking handler's batches go
        straight to the HandlerPool's threads (client/handler_pool.py); an async handler's run as
        tasks on the loop."""
        if self._batches is not None:
            self._batches.submit(pq, msgs)
            return
        pq.waiting.append(msgs)
        self._start_ready(pq)

    def _batch_done(self, run: BatchRun) -> None:
        """On the loop: a HandlerPool batch finished (or ran past consume_timeout)."""
        pq, msgs, oks = run.pq, run.msgs, run.results
        if type(msgs) is PulledBatch:
            self._pulled_done(pq, msgs, oks)
            return
        if oks.count(True) == len(msgs):
            pq.done_many(msgs)
            return
        # None: not handed out (stopping): neither done nor failed, it stays in flight
        handled = [m for m, ok in zip(msgs, oks, strict=True) if ok is True]
        failed = [m for m, ok in zip(msgs, oks, strict=True) if ok is False]
        pq.done_many(handled)
        self.stats["failed"] += len(failed)
        if failed and not pq.dropped:
            task = asyncio.ensure_future(self._send_back_or_retry(pq, failed))
            self._work.add(task)
            task.add_done_callback(self._work.discard)

    def _pulled_done(self, pq: ProcessQueue, batch: PulledBatch, oks: list[bool | None]) -> None:
        """On the loop: a PulledBatch's run finished. Its records up to the first one not handed
        out (None: stopping) are finished; the failed ones among them stay in flight one by one
        and go back to the broker (decoded again from the batch's bytes)."""
        n = len(oks)
        if oks.count(True) == n:
            pq.finish_batch(batch, n)
            return
        upto = oks.index(None) if None in oks else n
        failed = [batch.decode(i, i + 1)[0] for i in range(upto) if oks[i] is False]
        pq.finish_batch(batch, upto, failed)
        self.stats["failed"] += len(failed)
        if failed and not pq.dropped:
            task = asyncio.ensure_future(self._send_back_or_retry(pq, failed))
            self._work.add(task)
            task.add_done_callback(self._work.discard)

    def _count_handled(self, n: int) -> None:
        """HandlerPool: n messages were handled (called under the pool's lock, any thread)."""
        self.stats["handled"] += n

    def _collect(self) -> None:
        """Take in the batches the HandlerPool finished since the last look (loop thread)."""
        if self._batches is not None:
            self._batches.collect()

    def _expiry_check_interval(self) -> float:
        """How often to look for batches past consume_timeout (a fifth of it, 50 ms to 5 s)."""
        return max(0.05, min(5.0, self.consume_timeout / 5))

    async def _expire_stuck(self) -> None:
        if self._batches is not None and self._batches.expire(self.consume_timeout):
            log.warning("handler ran past consume_timeout (%.0fs): unfinished messages count as failed",
                        self.consume_timeout)

    def _start_ready(self, pq: ProcessQueue) -> None:
        while pq.waiting and pq.running < self.parallel_per_queue:
            msgs = pq.waiting.popleft()
            pq.running += 1
            task = asyncio.ensure_future(self._consume(pq, msgs))
            self._work.add(task)
            task.add_done_callback(self._work.discard)
            task.add_done_callback(lambda _t, pq=pq: self._finished_chunk(pq))

    def _finished_chunk(self, pq: ProcessQueue) -> None:
        pq.running -= 1
        if not pq.dropped and self._running:
            self._start_ready(pq)

    async def _consume(self, pq: ProcessQueue, msgs: list[ReceivedMessage] | PulledBatch) -> None:
        if not self._handing_out:
            return  # stopping: never handed out, so they stay in flight (uncommitted)
        oks = await self._handle(msgs, keep_going=self._keep_handing_out)
        if type(msgs) is PulledBatch:  # what the tag filter dropped is finished, not handled
            self.stats["handled"] += oks.count(True) - msgs.dropped
            self._pulled_done(pq, msgs, oks)
            return
        # None: not handed out (stopping): neither done nor failed, it stays in flight
        failed = [m for m, ok in zip(msgs, oks, strict=True) if ok is False]
        handled = [m for m, ok in zip(msgs, oks, strict=True) if ok is True]
        pq.done_many(handled)
        self.stats["handled"] += len(handled)
        self.stats["failed"] += len(failed)
        if failed and not pq.dropped:
            await self._send_back_or_retry(pq, failed)

    async def _send_back_or_retry(self, pq: ProcessQueue, failed: list[ReceivedMessage]) -> None:
        if self.mode == "broadcasting":
            retry = [m for m in failed if m.reconsume_times < self.max_reconsume_times]
            for m in failed:
                if m not in retry:
                    log.warning("broadcasting: dropping %s after %d failures", m.msg_id, m.reconsume_times)
                    pq.done(m)
            for m in retry:
                m.reconsume_times += 1
            if retry:
                await asyncio.sleep(self.suspend_seconds)
                self._dispatch(pq, retry)
            return
        local_retry = []
        for m in failed:
            if await self._send_back(m, None):
                pq.done(m)
            else:
                local_retry.append(m)
        if local_retry:  # the broker did not take them: keep them in the window and try here again
            await asyncio.sleep(self.suspend_seconds)
            if not pq.dropped:
                self._dispatch(pq, local_retry)

    async def _send_back(self, m: ReceivedMessage, delay_level: int | None) -> bool:
        assert self._conn is not None
        header: dict[str, Any] = {"group": self.group, "msg_id": m.msg_id,
                                  "max_reconsume": self.max_reconsume_times}
        if delay_level is not None:
            header["delay_level"] = delay_level
        try:
            await self._conn.request(Code.SEND_BACK, header)
        except EQueueError as e:
            log.warning("send-back of %s failed: %s", m.msg_id, e)
            return False
        self.stats["sent_back"] += 1
        if (RETRY_PREFIX + self.group, 0) not in self.queues:
            self.rebalance_soon(0.5)
        return True

    async def _orderly_loop(self, pq: ProcessQueue) -> None:
        """In offset order, one message at a time per queue: runs of pending messages go to the
        handler in one worker call that stops at the first failure. A failure suspends the queue
        and retries that message locally up to max_reconsume_times; then it goes to the DLQ and
        the queue moves on."""
        while self._running and not pq.dropped:
            if not pq.pending and pq.batches:
                self._decode_pending(pq)
            if not pq.pending or not pq.holds_lock():
                await pq.wait_change(0.5)
                continue
            run = list(itertools.islice(pq.pending, 0, max(self._pull_batch_of(pq).size, self.consume_batch_size)))
            epoch = pq.lock_epoch
            results = await self._handle(run, stop_on_failure=True,
                                         keep_going=lambda e=epoch: (self._handing_out and pq.holds_lock()
                                                                     and pq.lock_epoch == e))
            if pq.lock_epoch != epoch:  # the lock went away meanwhile: the pulled messages were dropped
                continue
            ok = 0
            while ok < len(run) and results[ok] is True:
                ok += 1
            for _ in range(ok):
                pq.pending.popleft()
            pq.done_many(run[:ok])
            self.stats["handled"] += ok
            if ok < len(run) and results[ok] is False:
                await self._orderly_failure(pq, run[ok])

    def _decode_pending(self, pq: ProcessQueue) -> None:
        """Orderly: the next messages of the queue's pulled answers, from bytes to `pending` (and
        in flight one by one, so the committable offset never passes them): DECODE_AT_MOST at a
        time, or a whole consume_batch_size run; a tag filter's exact check drops records here
        (few: the broker filters by tag hash). A whole answer decoded at the pull (up to 1024
        messages, all alive until handled) cost an orderly drain ~500 collections, a quarter of
        its time (docs/benchmarks.md, "Objects the collector need not count")."""
        want = max(DECODE_AT_MOST, self.consume_batch_size)
        pending = pq.pending
        while len(pending) < want and pq.batches:
            batch = pq.batches[0]
            upto = min(len(batch), batch.cursor + want - len(pending))
            msgs = batch.decode_kept(batch.cursor, upto)  # finish_batch finishes what it drops
            pq.finish_batch(batch, upto, msgs)
            pending.extend(msgs)

    async def _orderly_failure(self, pq: ProcessQueue, m: ReceivedMessage) -> None:
        """Retry a failed message in place (the queue waits), then dead-letter it."""
        failures = 1
        self.stats["failed"] += 1
        epoch = pq.lock_epoch
        while self._running and not pq.dropped and pq.lock_epoch == epoch:
            if not pq.holds_lock():
                await pq.wait_change(0.5)
                continue
            if failures > self.max_reconsume_times:
                while not await self._send_back(m, -1) and self._running:
                    await asyncio.sleep(self.suspend_seconds)
                break
            m.reconsume_times += 1
            await asyncio.sleep(self.suspend_seconds)
            if not pq.holds_lock() or pq.lock_epoch != epoch:
                continue
            if (await self._handle([m]))[0] is True:
                break
            failures += 1
            self.stats["failed"] += 1
        else:
            return  # dropped, closing or lock lost: the message stays uncommitted for the next owner
        if pq.lock_epoch != epoch:
            return
        self.stats["handled"] += 1
        pq.pending.popleft()
        pq.done(m)

    # ---------------------------------------------------------------- offsets

    async def commit(self) -> None:
        await self._commit_queues(list(self.queues.values()))

    async def _commit_queues(self, queues: list[ProcessQueue]) -> None:
        self._collect()
        if self.orderly:  # only the lock holder speaks for an orderly queue's offset
            queues = [pq for pq in queues if pq.locked and not pq.needs_offset]
        # a queue stopped at a corrupt record commits from its own loop (_park), so it never
        # overwrites the offset an admin's skip set meanwhile
        changed = [(pq, pq.committable()) for pq in queues if pq.parked_at is None]
        changed = [(pq, off) for pq, off in changed if off != pq.last_committed]
        if not changed:
            return
        if self.mode == "broadcasting":
            offsets = self._load_local_offsets()
            offsets.update({f"{pq.topic}:{pq.queue_id}": off for pq, off in changed})
            self._save_local_offsets(offsets)
        else:
            assert self._conn is not None
            await self._conn.request(Code.COMMIT_OFFSETS, {
                "group": self.group, "offsets": [[pq.topic, pq.queue_id, off] for pq, off in changed]})
        for pq, off in changed:
            pq.last_committed = off

    def _local_offsets_path(self) -> str:
        return os.path.join(self.offset_dir, f"{self.group}.offsets.json")

    def _load_local_offsets(self) -> dict[str, int]:
        try:
            with open(self._local_offsets_path()) as f:
                return {str(k): int(v) for k, v in json.load(f).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise ConfigError(f"broadcast offsets file {self._local_offsets_path()} is unreadable: {e}") from None

    def _save_local_offsets(self, offsets: dict[str, int]) -> None:
        os.makedirs(self.offset_dir, exist_ok=True)
        path = self._local_offsets_path()
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(offsets, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # ---------------------------------------------------------------- shutdown

    async def close(self, drain_timeout: float = 30.0) -> None:
        """Stop pulling, let in-flight handlers finish (up to drain_timeout), commit, leave the group.
        A rebalance in progress finishes first. An async handler may await it: the handler call
        that made it is not waited for (what it has not finished is not committed)."""
        if not self._running:
            return
        self._running = False
        self._stop_handing_out()  # the calls in progress finish; buffered messages stay unhandled
        if self._rebalance_soon is not None:
            self._rebalance_soon.cancel()
        # A rebalance in progress (a member joined or left just now) ends first, on a connection
        # still open: stopped halfway it would fail against the closed one, or leave a queue
        # taken out of `queues` without its offset committed. Any later one sees _running.
        async with self._rebalance_lock:
            pass
        # Never cancel or wait for the task this close() runs in, nor (when an async handler
        # calls it) the task awaiting that handler: a task waiting on itself never ends, and
        # cancelling a task that awaits a gather holding it recurses without end.
        me = asyncio.current_task()
        mine = {me, self._handler_runs.get(me)}
        background = [t for t in self._background if t not in mine]
        for t in background:
            t.cancel()
        pulls = [ts[0] for ts in self._tasks.values() if ts[0] not in mine]
        for t in pulls:
            t.cancel()
        deadline = time.monotonic() + drain_timeout
        batches = self._batches
        while ((work := self._work - mine) or (batches is not None and batches.busy)) \
                and time.monotonic() < deadline:
            if batches is not None and batches.busy:
                await batches.wait_idle(max(0.0, deadline - time.monotonic()))
            if work:
                await asyncio.wait(list(work), timeout=max(0.0, deadline - time.monotonic()))
        orderly = [ts[1] for ts in self._tasks.values() if len(ts) > 1 and ts[1] not in mine]
        for t in orderly:
            t.cancel()
        await asyncio.gather(*background, *pulls, *orderly, return_exceptions=True)
        try:
            await self.commit()
            if self._conn is not None and self.mode == "clustering":
                if self.orderly and self.queues:
                    await self._conn.request(Code.UNLOCK_QUEUES, {
                        "group": self.group, "client_id": self.client_id,
                        "queues": [[t, q] for t, q in self.queues]})
                await self._conn.request(Code.UNREGISTER, {"group": self.group, "client_id": self.client_id})
        except EQueueError as e:
            log.warning("closing consumer: %s", e)
        finally:
            if self._conn is not None:
                await self._conn.close()
            if self._pool is not None:
                # Join the worker threads unless a handler is still stuck past the drain timeout,
                # so a closed consumer leaves no threads behind.
                self._pool.shutdown(wait=not self._work, cancel_futures=True)
            if batches is not None:
                batches.shutdown(wait=not batches.busy)


def _id_prefix(address: str) -> str:
    from equeue_core import msgid
    from equeue_core.client.address import parse_address

    a = parse_address(address)
    return msgid.encode_prefix(a.host, a.port)


class Consumer:
    """The blocking consumer: `Consumer(group, broker=...)`, `subscribe(topic, expression="*")`,
    `start(handler)` (returns at once; consumption runs in the background), `close()`.
    A handler gets a ReceivedMessage; raising means the message failed."""

    def __new__(cls, group: str, broker: str = "127.0.0.1:10911", *, pull_in_handler_threads: bool = False,
                **options: Any) -> Any:
        if pull_in_handler_threads:
            from equeue_core.client.pulling_handlers import PullingHandlerConsumer

            return PullingHandlerConsumer(group, broker, **options)
        return super().__new__(cls)

    def __init__(self, group: str, broker: str = "127.0.0.1:10911", *, pull_in_handler_threads: bool = False,
                 **options: Any) -> None:
        """`Consumer(group, broker="h:p")`, or `Consumer(group, nameserver="h:p,h:p")` to consume
        every broker of a cluster (client/cluster_consumer.py). `pull_in_handler_threads=True`:
        each handler thread pulls its own share of the queues and runs the handler on what it
        read, one thread wake-up a message instead of two (client/pulling_handlers.py; tcp and
        tls, clustering, not orderly)."""
        background_loop()
        self._async = AsyncConsumer(group, broker, **options)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    @property
    def stats(self) -> dict[str, int]:
        return self._async.stats

    def assigned_queues(self) -> list[QueueKey]:
        return sorted(self._async.queues)

    def pull_batches(self) -> dict[QueueKey, int]:
        """The current pull batch size of every assigned queue (adaptive unless pull_batch= was given)."""
        return self._async.pull_batches()

    def subscribe(self, topic: str, expression: str = "*") -> Consumer:
        self._async.subscribe(topic, expression)
        return self

    def start(self, handler: Callable[[ReceivedMessage], Any]) -> Consumer:
        run_sync(self._async.start(handler))
        return self

    def commit(self) -> None:
        run_sync(self._async.commit())

    def stop_handling(self) -> None:
        """Hand no more messages to the handler (a handler may call it); see AsyncConsumer."""
        self._async.stop_handling()

    def close(self) -> None:
        run_sync(self._async.close())

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
