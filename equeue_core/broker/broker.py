"""The broker: wires config to plugins and serves requests over the chosen transport.

It owns no storage and no sockets: the store engine (message store, queue index, offsets,
metadata) and the transport come from plugins picked by name. Everything runs on one asyncio
loop; the store's single writer is that loop's thread, and fsyncs happen on the store's flusher
thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from equeue_core import frame as framing
from equeue_core import msgid, record
from equeue_core.broker.busy_poll import BusyPoll
from equeue_core.broker.groups import GroupRegistry
from equeue_core.broker.long_poll import HeldPull, LateAnswer, PullHold
from equeue_core.broker.metrics import BrokerMetrics
from equeue_core.broker.multi_pull import error_result, parse_pulls, records_budget
from equeue_core.broker.multi_send import answer_header, parse_sections
from equeue_core.broker.offset_commits import checked_entries
from equeue_core.broker.retention import RetentionCleaner
from equeue_core.broker.schedule import Scheduler
from equeue_core.broker.topics import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    SYSTEM_PREFIXES,
    TopicRegistry,
    check_producer_topic,
    check_topic_name,
)
from equeue_core.codes import MAX_PULL_COUNT, Code, PullStatus
from equeue_core.config import Config, parse_delay_levels
from equeue_core.contracts import ServerConnection, StoreSettings
from equeue_core.errors import (
    CorruptRecordError,
    EQueueError,
    InvalidMessageError,
    OffsetOutOfRangeError,
    ProtocolError,
    UnknownRequestError,
)
from equeue_core.export import BROKER_INFO
from equeue_core.frame import FLAG_ONEWAY, FLAG_RESPONSE, BodyParts, Frame
from equeue_core.plugins import PluginManager, get_plugin_manager
from equeue_core.queue_prep import QueuePreparer
from equeue_core.replication.replication import Replication
from equeue_core.serving import access_gate, server_settings
from equeue_core.store_sections import append_sections
from equeue_core.threads import run_to_end

log = logging.getLogger("equeue.broker")
PULL_HEADER_ROOM = 4096  # bytes of a pull answer's frame kept for its header (status, offsets)

Handler = Callable[[ServerConnection, Frame], Awaitable[Frame | None]]
NowHandler = Callable[[ServerConnection, Frame], "Frame | None | Awaitable[Frame | None]"]
# Requests a replica refuses with not_master (Broker.append refuses the scheduler's writes too).
WRITE_CODES = frozenset({Code.SEND, Code.SEND_MULTI, Code.SEND_BACK, Code.CREATE_TOPIC, Code.DELETE_TOPIC})


def _int(header: dict, key: str, default: Any = ...) -> int:
    v = header.get(key, default)
    if v is ... or not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"header field {key!r} must be an integer")
    return v


MAX_QUERIED_QUEUES = 4096  # queues one QUERY_OFFSET may ask about (4x the most a topic has)


def _str(header: dict, key: str) -> str:
    v = header.get(key)
    if not isinstance(v, str):
        raise ProtocolError(f"header field {key!r} must be a string")
    return v


class Broker:
    def __init__(self, config: Config, plugins: PluginManager | None = None) -> None:
        self.config = config
        self.plugins = plugins or get_plugin_manager()
        self.hold = PullHold()
        self._server = None
        self._tasks: list[asyncio.Task] = []
        self._handlers: dict[int, Handler] = {}
        self._now_handlers: dict[int, NowHandler] = {}
        self.now_codes: frozenset[int] = frozenset()  # the codes handle_now answers
        self.address: tuple[str, int] = (config.host, config.port)
        self.id_prefix = ""
        self.started = asyncio.Event()
        self.stats = {"received": 0, "pulled": 0}
        # Bytes of records a pull answer carries at most: pull_max_bytes, but never more than a
        # frame can carry (with room for the answer's header), whatever max_count a consumer asks
        # for: an adaptive pull batch grows its max_count without knowing max_frame_size.
        self._pull_max_bytes = max(1, min(config.pull_max_bytes, config.max_frame_size - PULL_HEADER_ROOM))
        self.busy_poll = BusyPoll(None, 0.0)  # off until start() has the loop
        self.registrar = None  # a BrokerRegistrar when config.nameserver names a cluster's name servers
        self.access = None  # an AccessGate when an authorizer is configured (docs/security.md)
        self.replication: Replication | None = None  # master/replica role (docs/replication.md)
        self._scheduler_task: asyncio.Task | None = None  # runs on a master only
        self._scheduler_stale = False  # was stopped as a replica: reload it from the store when master again

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        cfg = self.config
        os.makedirs(cfg.data_dir, exist_ok=True)
        settings = StoreSettings(data_dir=cfg.data_dir, flush=cfg.flush,
                                 flush_interval_ms=cfg.flush_interval_ms,
                                 options=cfg.store_settings_options(), max_batch_bytes=cfg.max_frame_size)
        opened = time.perf_counter()
        self.engine = self.plugins.store_engine(cfg.store)(settings)  # recovers; takes the writer lock
        self.metrics = BrokerMetrics(self, recovery_seconds=time.perf_counter() - opened)
        self.recovery = self.engine.recovery
        self.store = self.engine.messages
        self.offsets = self.engine.offsets
        self.topics = TopicRegistry(self.engine.topics, cfg.default_queues, cfg.auto_create_topics)
        self.queue_prep = QueuePreparer(self.store)
        self.topics.on_grown = self.queue_prep.prepare
        for topic, queues in self.store.queues().items():  # topics written before metadata was
            if topic not in self.topics.topics:
                self.topics.topics[topic] = max(queues) + 1
        self.groups = GroupRegistry(self, cfg.heartbeat_expiry_s, cfg.queue_lock_expiry_s)
        self.delay_levels = parse_delay_levels(cfg.delay_levels)
        self.scheduler = Scheduler(self)
        self.retention = RetentionCleaner(self, cfg.retention_hours, cfg.retention_policy, cfg.retention_check_s,
                                          cfg.disk_high_water)
        self.replication = Replication(self)
        transport = self.plugins.transport(cfg.transport)
        tsettings = server_settings(cfg)
        self._register_handlers()
        self.access = access_gate(cfg, self.plugins)
        self.metrics_address = self.metrics.start(cfg.metrics_host, cfg.metrics_port)
        self.busy_poll = BusyPoll(asyncio.get_running_loop(), cfg.busy_poll_us / 1e6)
        self._server = await transport.serve(cfg.host, cfg.port, self, tsettings)
        self.address = tuple(self._server.address)[:2]  # type: ignore[assignment]
        self.id_prefix = msgid.encode_prefix(*self.address)
        self._write_info()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._persist_offsets_forever()))
        self._tasks.append(loop.create_task(self.groups.expire_forever()))
        self._tasks.append(loop.create_task(self.retention.run_forever()))
        await self.replication.start()  # a master starts the scheduler (role_changed)
        if cfg.nameserver:
            await self._join_cluster()
        self.started.set()

    def role_changed(self, master: bool) -> None:
        """Replication switched this broker's role: only a master delivers delayed messages (a
        replica's copies of them arrive through the log). A scheduler stopped as a replica is
        rebuilt from the store when master again, as at a start."""
        if master and self._scheduler_task is None:
            if self._scheduler_stale:
                self.scheduler = Scheduler(self)
                self._handlers.update(self.scheduler.handlers())
                self._scheduler_stale = False
            self._scheduler_task = asyncio.get_running_loop().create_task(self.scheduler.run_forever())
        elif not master and self._scheduler_task is not None:
            self._scheduler_task.cancel()
            self._scheduler_task = None
            self._scheduler_stale = True
        elif not master:
            self._scheduler_stale = True

    async def _join_cluster(self) -> None:
        """Register with the name servers (docs/cluster.md); a refused name stops the broker cleanly."""
        from equeue_core.broker.registration import BrokerRegistrar

        try:
            self.registrar = BrokerRegistrar.for_broker(self)
            self.topics.on_change = self.registrar.topics_changed
            await self.registrar.start()
        except BaseException:
            self.registrar = None
            await self.stop()
            raise

    def _write_info(self) -> None:
        info = {"host": self.address[0], "port": self.address[1], "store": self.config.store,
                "transport": self.config.transport, "pid": os.getpid(), "started": int(time.time())}
        path = os.path.join(self.config.data_dir, BROKER_INFO)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)

    async def _persist_offsets_forever(self) -> None:
        interval = self.config.offset_persist_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await run_to_end(self.offsets.persist)  # its fsync stays off the event loop
            except Exception:
                log.exception("persisting offsets failed")

    async def stop(self) -> None:
        """Stop serving, answer held pulls, persist offsets, flush and close the store."""
        if self.registrar is not None:
            await self.registrar.stop()
        if self.replication is not None:
            await self.replication.stop()
        tasks = self._tasks + ([self._scheduler_task] if self._scheduler_task is not None else [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.hold.wake_all()
        if self._server is not None:
            await self._server.close()
        await self.metrics.stop()
        if self.access is not None:
            self.access.close()
        self.queue_prep.close()
        self.engine.close()  # persists offsets, flushes, releases the writer lock

    # ------------------------------------------------------------------ transport callbacks

    async def handle(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        handler = self._handlers.get(frame.code)
        try:
            self._admit(conn, frame, handler)
            return await handler(conn, frame)  # type: ignore[misc]
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return self._failed(frame, e)

    def handle_now(self, conn: ServerConnection, frame: Frame) -> Frame | None | Awaitable[Frame | None]:
        """The transport's fast path (contracts.ImmediateServerHandler), for the codes in
        `now_codes` only: does the request's synchronous part now and answers it in the same
        call when it needs no wait (a send with flush=async and no sync replication, a pull whose
        first read finds records, commits, routes); otherwise returns an awaitable of the answer
        (the transport runs it as a task: flush=sync, sync replication, a held pull). Errors are
        answered exactly as `handle` answers them."""
        try:
            self._admit(conn, frame, self._handlers.get(frame.code))
            answer = self._now_handlers[frame.code](conn, frame)
        except Exception as e:
            return self._failed(frame, e)
        if answer is None or type(answer) is Frame or type(answer) is LateAnswer:
            return answer  # (a LateAnswer answers its errors itself)
        return self._finish(frame, answer)

    async def _finish(self, frame: Frame, rest: Awaitable[Frame | None]) -> Frame | None:
        try:
            return await rest
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return self._failed(frame, e)

    def _admit(self, conn: ServerConnection, frame: Frame, handler: Handler | None) -> None:
        """What every request passes before its handler: a known code, a map header, the
        access check, and on a replica no writes."""
        self.busy_poll.poke()
        if handler is None:
            raise UnknownRequestError(f"unknown request code {frame.code}")
        if not isinstance(frame.header, dict):
            raise ProtocolError("frame header must be a map")
        if self.access is not None:
            self.access.check(conn, frame)
        if frame.code in WRITE_CODES:
            self.replication.check_writable()  # a replica refuses writes: not_master

    def _failed(self, frame: Frame, e: Exception) -> Frame | None:
        """The error answer to a request whose handler raised (None for a one-way request)."""
        if isinstance(e, EQueueError):
            if frame.is_oneway:
                return None
            return frame.error_response(e.code, str(e), **e.wire_details())
        # a bug answers one request, it never takes the broker down
        log.error("request %s failed", frame.code, exc_info=e)
        if frame.is_oneway:
            return None
        return frame.error_response("internal", f"{type(e).__name__}: {e}")

    def connection_lost(self, conn: ServerConnection) -> None:
        self.groups.connection_lost(conn)
        if self.replication is not None:
            self.replication.connection_lost(conn.id)

    def _register_handlers(self) -> None:
        self._handlers = {
            Code.SEND: self.on_send,
            Code.SEND_MULTI: self.on_send_multi,
            Code.ROUTE: self.on_route,
            Code.PULL: self.on_pull,
            Code.PULL_MULTI: self.on_pull_multi,
            Code.COMMIT_OFFSETS: self.on_commit_offsets,
            Code.QUERY_OFFSET: self.on_query_offset,
            Code.CREATE_TOPIC: self.on_create_topic,
            Code.LIST_TOPICS: self.on_list_topics,
            Code.DELETE_TOPIC: self.on_delete_topic,
            Code.GET_MESSAGE: self.on_get_message,
            Code.QUEUE_RANGES: self.on_queue_ranges,
            Code.OFFSET_FOR_TIME: self.on_offset_for_time,
            Code.BROKER_INFO: self.on_broker_info,
            Code.QUERY_BY_KEY: self.on_query_by_key,
            Code.SKIP_RECORD: self.on_skip_record,
        }
        self._handlers.update(self.groups.handlers())
        self._handlers.update(self.scheduler.handlers())
        self._handlers.update(self.metrics.handlers())
        self._handlers.update(self.replication.handlers())
        # the synchronous variants handle_now runs (same answers, no task when nothing waits)
        self._now_handlers = {
            Code.SEND: self.send_now,
            Code.SEND_MULTI: self.send_multi_now,
            Code.PULL: self.pull_now,
            Code.PULL_MULTI: self.pull_multi_now,
            Code.COMMIT_OFFSETS: self.commit_offsets_now,
            Code.ROUTE: self.route_now,
            Code.QUERY_OFFSET: self.query_offset_now,
        }
        self.now_codes = frozenset(self._now_handlers)

    # ------------------------------------------------------------------ storing

    def append(self, topic: str, queue_id: int, batch: bytearray, starts: list[int]):
        """Store a validated batch and wake pulls held on its queue. Synchronous: arrival order
        of send requests is store order. NotMasterError on a replica."""
        self.replication.check_writable()
        return self._store(topic, queue_id, batch, starts)

    def _store(self, topic: str, queue_id: int, batch: bytearray, starts: list[int]):
        """`append` once the broker is known to be writable (send_now: `_admit` checked it in
        the same synchronous call)."""
        result = self.store.append(topic, queue_id, batch, starts)
        self.replication.appended()
        self._stored(((topic, queue_id, batch, starts),))
        return result

    def _stored(self, sections: Sequence[tuple[str, int, bytearray, Sequence[int]]]) -> None:
        """After these (topic, queue_id, batch, starts) batches were stored: the counters, and the
        pulls held on their queues woken. One call a request: a SEND_MULTI over 100 topics has
        ~80 sections (bench.bench_sections)."""
        count = 0
        stored = self.metrics.stored
        notify = self.hold.notify
        for topic, queue_id, batch, starts in sections:
            n = len(starts)
            count += n
            stored(topic, n, len(batch))
            notify(topic, queue_id)
        self.stats["received"] += count

    def _check_destination(self, topic: str, queue_id: int) -> None:
        """What a SEND's topic and queue id (and each SEND_MULTI section's) must pass, in this
        order, with these errors: never a system topic; an unknown topic is created if its name
        is valid; the queue id must be one of the topic's."""
        check_producer_topic(topic)
        queues = self.topics.topics.get(topic)
        if queues is None:
            check_topic_name(topic)
            self.topics.queues(topic, create=True)
        if queues is None or not 0 <= queue_id < queues:
            self.topics.check_queue(topic, queue_id)

    async def durable(self, result) -> None:
        await self._durable_at(result.end_position)

    async def _durable_at(self, end_position: int) -> None:
        if self.config.flush == "sync":
            await asyncio.wrap_future(self.store.wait_flushed(end_position))

    async def on_send(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        answer = self.send_now(conn, frame)
        if answer is None or type(answer) is Frame:
            return answer
        return await answer

    async def on_send_multi(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        answer = self.send_multi_now(conn, frame)
        if answer is None or type(answer) is Frame:
            return answer
        return await answer

    def send_now(self, conn: ServerConnection, frame: Frame) -> Frame | None | Awaitable[Frame | None]:
        """Validate and store a send now (arrival order is store order); its answer now when
        nothing is to wait for, else an awaitable of it: flush=sync waits for the fsync, sync
        replication for the replicas, before anything is acknowledged.

        The one-by-one producer's request runs this once per message, so the plain case (a
        header of just topic and queue id, a known topic) takes no detour: the same checks, in
        the same order, with the same errors, as the general path it falls back to for the rest
        (delays, epochs, new topics, bad fields). Only called after `_admit` (handle_now, handle),
        which refused writes on a replica in this same synchronous call."""
        arrived = time.perf_counter()
        h = frame.header
        topic = h.get("topic")
        if type(topic) is not str:
            topic = _str(h, "topic")
        queue_id = h.get("queue_id")
        if type(queue_id) is not int:
            queue_id = _int(h, "queue_id")
        self._check_destination(topic, queue_id)
        body = frame.body
        if not body:
            raise InvalidMessageError("a send carries at least one message")
        # A bytearray body is the request's own (transport contract, framing.py): stamp it in
        # place; any other body (bytes, a memoryview of a shared buffer) is copied first.
        batch = body if type(body) is bytearray else bytearray(body)
        try:
            starts = record.scan(batch, topic=topic.encode(), max_body=self.config.max_body_size)
        except CorruptRecordError as e:
            raise InvalidMessageError(f"malformed message batch: {e}") from None
        replication = self.replication
        # topic and queue_id are both there: a header of two keys asks for no delay and no epoch
        delayed = None if len(h) == 2 else self.scheduler.due_time(h)
        if len(h) != 2:
            replication.check_epoch(h)  # a write stamped with another epoch: not_master
        sync = replication.sync_write()  # sync replication: not_enough_replicas before storing
        if delayed is not None:
            result = self.scheduler.schedule_batch(topic, queue_id, batch, starts, *delayed)
        else:
            result = self._store(topic, queue_id, batch, starts)
        if sync:
            # one wait per request for both: the local flush and the replicas' acknowledgements,
            # the latter watched from this turn on (a demotion before the wait begins fails it)
            return self._send_acknowledged(result.end_position, replication.watch_replicated(result.end_position),
                                           functools.partial(self._send_answer, frame, queue_id, result, arrived))
        if self.config.flush == "sync":
            return self._send_when_durable(frame, result.end_position,
                                           functools.partial(self._send_answer, frame, queue_id, result, arrived))
        return self._send_answer(frame, queue_id, result, arrived)

    def send_multi_now(self, conn: ServerConnection, frame: Frame) -> Frame | None | Awaitable[Frame | None]:
        """SEND_MULTI (broker/multi_send.py): every section checked as `send_now` checks a
        send, before any is stored; then stored in order, each as its SEND would be. Answered
        once for all, when the last stored section is as durable (and replicated) as a SEND's
        answer waits for. Only called after `_admit`, which refused writes on a replica."""
        arrived = time.perf_counter()
        h = frame.header
        body = frame.body
        sections = parse_sections(h, len(body))
        replication = self.replication
        if len(h) != 1:
            replication.check_epoch(h)  # a write stamped with another epoch: not_master
        view = memoryview(body)
        max_body = self.config.max_body_size
        known = self.topics.topics  # name -> queue count
        batches = []
        for i, (topic, queue_id, start, end) in enumerate(sections):
            queues = known.get(topic)
            # a known topic's queue needs no call (~80 sections a frame over 100 topics); anything
            # else gets _check_destination's errors, in its order, or its new topic
            if queues is None or not 0 <= queue_id < queues or topic.startswith(SYSTEM_PREFIXES):
                self._check_destination(topic, queue_id)
            batch = bytearray(view[start:end])  # the store stamps it in place
            try:
                starts = record.scan(batch, topic=topic.encode(), max_body=max_body)
            except CorruptRecordError as e:
                raise InvalidMessageError(f"malformed message batch in section {i} ({topic!r}): {e}") from None
            batches.append((topic, queue_id, batch, starts))
        sync = replication.sync_write()  # sync replication: not_enough_replicas before storing
        # nothing stored raises (the request's error answer); else `failed` is the error of the
        # first section not stored, and of every later one
        stored, failed = append_sections(self.store, batches)
        replication.appended()
        self._stored(batches[:len(stored)])
        answer = functools.partial(self._send_multi_answer, frame, stored, failed, arrived)
        if sync:
            end = stored[-1].end_position
            return self._send_acknowledged(end, replication.watch_replicated(end), answer)
        if self.config.flush == "sync":
            return self._send_when_durable(frame, stored[-1].end_position, answer)
        return answer()

    def _send_multi_answer(self, frame: Frame, stored: list, failed: EQueueError | None,
                           arrived: float) -> Frame | None:
        self.metrics.send_latency.observe(time.perf_counter() - arrived)
        if frame.flags & FLAG_ONEWAY:
            return None
        return Frame(frame.code, frame.request_id, FLAG_RESPONSE, answer_header(stored, failed, self.id_prefix))

    def _send_when_durable(self, frame: Frame, end_position: int,
                           answer: Callable[[], Frame | None]) -> Frame | None | LateAnswer:
        """flush=sync without sync replication: `answer()` once the store's flush covers
        `end_position` (the frame's error answer if that flush failed), given as a LateAnswer
        from the one call_soon_threadsafe the flusher thread makes and written in that loop turn:
        a single send pays no task, no coroutines, no asyncio future chained to the store's and
        no extra loop turns (docs/benchmarks.md, "Single sends with flush=sync")."""
        flushed = self.store.wait_flushed(end_position)
        if flushed.done() and flushed.exception() is None:
            return answer()
        loop = self.hold.loop  # the broker's loop, taken once (no getpid() call per send)
        late = LateAnswer(loop)

        def give(done) -> None:  # on the loop
            if late.done():
                return  # the connection went away
            error = done.exception()
            if error is None:
                try:
                    late.answer(answer())
                except Exception as e:
                    late.answer(self._failed(frame, e))
            else:
                late.answer(self._failed(frame, error))

        def resolved(done) -> None:  # on the flusher thread
            try:
                loop.call_soon_threadsafe(give, done)
            except RuntimeError:
                pass  # the loop is closed: the broker stopped, nobody is left to answer

        flushed.add_done_callback(resolved)
        return late

    async def _send_acknowledged(self, end_position: int, watched: Any,
                                 answer: Callable[[], Frame | None]) -> Frame | None:
        """Sync replication: `answer()` once `acknowledged`."""
        await self.acknowledged(end_position, watched)
        return answer()

    async def acknowledged(self, end_position: int, watched: Any) -> None:
        """A write stored under sync replication may be answered: `end_position` flushed as
        configured and acknowledged by enough replicas (`watched`: Replication.watch_replicated,
        started in the loop turn that stored it), the two waits together."""
        await asyncio.gather(self._durable_at(end_position), self.replication.replicated(watched))

    def _send_answer(self, frame: Frame, queue_id: int, result, arrived: float) -> Frame | None:
        self.metrics.send_latency.observe(time.perf_counter() - arrived)
        if frame.flags & FLAG_ONEWAY:
            return None
        return Frame(frame.code, frame.request_id, FLAG_RESPONSE,
                     {"queue_id": queue_id, "first_offset": result.first_queue_offset,
                      "positions": result.positions, "id_prefix": self.id_prefix})

    # ------------------------------------------------------------------ reading

    async def on_route(self, conn: ServerConnection, frame: Frame) -> Frame:
        return self.route_now(conn, frame)

    def route_now(self, conn: ServerConnection, frame: Frame) -> Frame:
        topic = _str(frame.header, "topic")
        create = bool(frame.header.get("create", False))
        if create:
            check_topic_name(topic)  # producers never create system topics
        system = topic.startswith((RETRY_PREFIX, DLQ_PREFIX))
        queues = self.topics.queues(topic, create=create, system=system)
        return frame.response({"topic": topic, "queues": queues,
                               "broker": f"{self.address[0]}:{self.address[1]}",
                               "id_prefix": self.id_prefix})

    async def on_pull(self, conn: ServerConnection, frame: Frame) -> Frame:
        answer = self.pull_now(conn, frame)
        if type(answer) is Frame:
            return answer
        return await answer  # type: ignore[misc]

    def pull_now(self, conn: ServerConnection, frame: Frame) -> Frame | Awaitable[Frame]:
        """The pull's first read now: its answer when it finds records (or an error, or the
        consumer asked not to be held), else an awaitable that holds the pull until records
        arrive or hold_ms passes.

        Every consumer's pull runs this, and at a steady rate every message costs one, so a
        header of the usual types is read without calls (as in send_now); any other value goes
        through the general checks, with their errors."""
        arrived = time.perf_counter()
        h = frame.header
        topic = h.get("topic")
        if type(topic) is not str:
            topic = _str(h, "topic")
        queue_id = h.get("queue_id")
        if type(queue_id) is not int:
            queue_id = _int(h, "queue_id")
        offset = h.get("offset")
        if type(offset) is not int:
            offset = _int(h, "offset")
        max_count = h.get("max_count")
        if type(max_count) is not int:
            max_count = _int(h, "max_count", self.config.pull_batch)
        max_count = 1 if max_count < 1 else MAX_PULL_COUNT if max_count > MAX_PULL_COUNT else max_count
        hold_ms = h.get("hold_ms")
        if type(hold_ms) is not int:
            hold_ms = _int(h, "hold_ms", self.config.long_poll_ms)
        hold_ms = 0 if hold_ms < 0 else 60_000 if hold_ms > 60_000 else hold_ms
        tags = h.get("tags")
        tag_hashes = frozenset(tags) if tags and type(tags) is list else None
        queues = self.topics.topics.get(topic)
        if queues is None or not 0 <= queue_id < queues:
            self.topics.check_queue(topic, queue_id)
        deadline = time.monotonic() + hold_ms / 1000
        res = self._pull_read(frame, topic, queue_id, offset, max_count, tag_hashes)
        if type(res) is Frame:
            return res
        if res.count or res.next_offset != offset or deadline - time.monotonic() <= 0:
            return self._pull_answer(frame, topic, res, arrived, 0.0)
        return self._pull_held(frame, topic, queue_id, offset, max_count, tag_hashes, arrived, deadline)

    def _pull_held(self, frame: Frame, topic: str, queue_id: int, offset: int, max_count: int,
                   tag_hashes: frozenset | None, arrived: float, deadline: float) -> LateAnswer:
        """Hold the pull (its first read found nothing) until records arrive or deadline: an
        arrival reads again and answers in the appending turn itself (long_poll.py); a read that
        still finds nothing (a tag filter) holds on. Errors are answered like handle's."""
        parked_at = time.perf_counter()

        def answer(final: bool) -> Frame | None:
            try:
                res = self._pull_read(frame, topic, queue_id, offset, max_count, tag_hashes)
                if type(res) is Frame:
                    return res
                if res.count or res.next_offset != offset or final or time.monotonic() >= deadline:
                    return self._pull_answer(frame, topic, res, arrived, time.perf_counter() - parked_at)
                return None
            except Exception as e:
                return self._failed(frame, e)

        return HeldPull(self.hold, topic, queue_id, deadline, answer).late

    async def on_pull_multi(self, conn: ServerConnection, frame: Frame) -> Frame:
        return self.pull_multi_now(conn, frame)

    def pull_multi_now(self, conn: ServerConnection, frame: Frame) -> Frame:
        """PULL_MULTI (broker/multi_pull.py): each section read as pull_now's first read, in
        order, none held; a section's error is its result; the records within one budget."""
        arrived = time.perf_counter()
        pulls = parse_pulls(frame.header)
        budget = records_budget(self._pull_max_bytes, self.config.max_frame_size, PULL_HEADER_ROOM, len(pulls))
        results: list[Any] = []
        bodies = []
        used = 0
        topics = self.topics.topics
        for topic, queue_id, offset, max_count, tag_hashes in pulls:
            try:
                queues = topics.get(topic)
                if queues is None or not 0 <= queue_id < queues:
                    self.topics.check_queue(topic, queue_id)
                res = self._pull_read(frame, topic, queue_id, offset, max_count, tag_hashes, budget - used)
            except EQueueError as e:
                results.append(error_result(e))
                continue
            if type(res) is Frame:  # OFFSET_RESET
                h = res.header
                results.append([h["status"], h["next_offset"], h["min_offset"], h["max_offset"], 0, 0])
                continue
            size = len(res.records)
            if used and used + size > budget:
                break  # this one and the rest are pulled again
            used += size
            bodies.append(res.records)
            results.append([self._pulled(topic, res, time.perf_counter() - arrived), res.next_offset,
                            res.min_offset, res.max_offset, res.count, size])
            if used >= budget:
                break
        # the sections' records go out as they were read, not joined into one more copy
        return frame.response({"results": results}, bodies[0] if len(bodies) == 1 else BodyParts(bodies))

    def _pull_read(self, frame: Frame, topic: str, queue_id: int, offset: int, max_count: int,
                   tag_hashes: frozenset | None, max_bytes: int | None = None):
        """One read of a pull: the store's ReadResult, or the OFFSET_RESET answer to an offset
        outside the queue (OffsetOutOfRangeError itself if the consumer asked for `strict`)."""
        try:
            return self.store.read_queue(topic, queue_id, offset, max_count,
                                         self._pull_max_bytes if max_bytes is None else max_bytes, tag_hashes)
        except CorruptRecordError as e:
            log.error("pull %s/%d of group %s refused: %s (skip it with `equeue groups skip`)",
                      topic, queue_id, frame.header.get("group"), e)
            raise
        except OffsetOutOfRangeError as e:
            if frame.header.get("strict"):
                raise
            lo, hi = e.min_offset, e.max_offset
            nxt = lo if offset < lo else hi
            return frame.response({"status": PullStatus.OFFSET_RESET, "next_offset": nxt,
                                   "min_offset": lo, "max_offset": hi, "count": 0})

    def _pull_answer(self, frame: Frame, topic: str, res, arrived: float, parked: float) -> Frame:
        status = self._pulled(topic, res, time.perf_counter() - arrived - parked)
        return frame.response({"status": status, "next_offset": res.next_offset,
                               "min_offset": res.min_offset, "max_offset": res.max_offset,
                               "count": res.count}, res.records)

    def _pulled(self, topic: str, res, seconds: float) -> str:
        """Count a pull's read (stats, metrics: `seconds` building its answer); its status."""
        self.stats["pulled"] += res.count
        self.metrics.pulled(topic, res.count, len(res.records), seconds)
        return PullStatus.FOUND if res.count else PullStatus.NO_NEW

    async def on_commit_offsets(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        return self.commit_offsets_now(conn, frame)

    def commit_offsets_now(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        group = _str(frame.header, "group")
        # all or nothing: one bad entry refuses the request before any of it is committed
        for topic, queue_id, offset in checked_entries(group, frame.header.get("offsets")):
            self.offsets.commit(group, topic, queue_id, offset)
        return None if frame.is_oneway else frame.response({})

    async def on_query_offset(self, conn: ServerConnection, frame: Frame) -> Frame:
        return self.query_offset_now(conn, frame)

    def query_offset_now(self, conn: ServerConnection, frame: Frame) -> Frame:
        """One queue (`topic`, `queue_id`), or many at once (`queues`: a consumer that is given
        1000 queues learns where to start them all in one round trip, not 1000)."""
        h = frame.header
        group = _str(h, "group")
        if "queues" not in h:
            topic, queue_id = _str(h, "topic"), _int(h, "queue_id")
            offset, lo, hi = self._offset_point(group, topic, queue_id)
            return frame.response({"offset": offset, "min_offset": lo, "max_offset": hi})
        queues = h["queues"]
        if not isinstance(queues, list) or len(queues) > MAX_QUERIED_QUEUES:
            raise ProtocolError(f"header field 'queues' must be a list of at most {MAX_QUERIED_QUEUES} "
                                "[topic, queue_id] pairs")
        points = []
        for entry in queues:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], int) and not isinstance(entry[1], bool)):
                raise ProtocolError("each entry of 'queues' must be [topic, queue_id]")
            points.append(list(self._offset_point(group, entry[0], entry[1])))
        return frame.response({"points": points})

    def _offset_point(self, group: str, topic: str, queue_id: int) -> tuple[int | None, int, int]:
        """(the group's committed offset or None, the queue's min offset, its max offset)."""
        self.topics.check_queue(topic, queue_id)
        lo, hi = self.store.queue_range(topic, queue_id)
        return self.offsets.get(group, topic, queue_id), lo, hi

    async def on_skip_record(self, conn: ServerConnection, frame: Frame) -> Frame:
        """Admin: move a group past one record (a corrupt one its consumers cannot read), by
        committing offset + 1 for the group; never moves a group backwards."""
        h = frame.header
        group, topic, queue_id, offset = _str(h, "group"), _str(h, "topic"), _int(h, "queue_id"), _int(h, "offset")
        self.topics.check_queue(topic, queue_id)
        lo, hi = self.store.queue_range(topic, queue_id)
        if not lo <= offset < hi:
            raise OffsetOutOfRangeError(f"offset {offset} of {topic}/{queue_id} is outside [{lo}, {hi})",
                                        min_offset=lo, max_offset=hi)
        current = self.offsets.get(group, topic, queue_id)
        if current is not None and current > offset:  # already past it: nothing to skip
            return frame.response({"skipped": False, "next_offset": current, "previous": current, "corrupt": ""})
        try:
            self.store.read_queue(topic, queue_id, offset, 1, self.config.pull_max_bytes)
            damage = None
        except CorruptRecordError as e:
            damage = str(e)
        self.offsets.commit(group, topic, queue_id, offset + 1)
        self.offsets.persist()
        log.warning("group %s skipped %s/%d offset %d (%s) by admin request", group, topic, queue_id,
                    offset, damage or "the record was readable")
        return frame.response({"skipped": True, "next_offset": offset + 1, "previous": current,
                               "corrupt": damage or ""})

    async def on_offset_for_time(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        topic, queue_id, ts = _str(h, "topic"), _int(h, "queue_id"), _int(h, "ts_ms")
        self.topics.check_queue(topic, queue_id)
        return frame.response({"offset": self.store.offset_for_timestamp(topic, queue_id, ts)})

    # ------------------------------------------------------------------ admin

    async def on_create_topic(self, conn: ServerConnection, frame: Frame) -> Frame:
        topic = _str(frame.header, "topic")
        queues = frame.header.get("queues")
        n = self.topics.create(topic, None if queues is None else _int(frame.header, "queues"))
        return frame.response({"topic": topic, "queues": n})

    async def on_delete_topic(self, conn: ServerConnection, frame: Frame) -> Frame:
        topic = _str(frame.header, "topic")
        self.topics.queues(topic)
        self.topics.delete(topic)
        return frame.response({})

    def queue_ranges(self, topic: str) -> list[list[int]]:
        return [list(self.store.queue_range(topic, q)) for q in range(self.topics.queues(topic))]

    async def on_list_topics(self, conn: ServerConnection, frame: Frame) -> Frame:
        include_system = bool(frame.header.get("system", False))
        topics = {t: {"queues": n, "ranges": self.queue_ranges(t)}
                  for t, n in sorted(self.topics.topics.items())
                  if include_system or not t.startswith("%")}
        return frame.response({"topics": topics})

    async def on_queue_ranges(self, conn: ServerConnection, frame: Frame) -> Frame:
        return frame.response({"ranges": self.queue_ranges(_str(frame.header, "topic"))})

    async def on_get_message(self, conn: ServerConnection, frame: Frame) -> Frame:
        _host, _port, position = msgid.decode(_str(frame.header, "msg_id"))
        return frame.response({}, self.store.read_position(position))

    def find_by_key(self, topic: str, key: str, max_results: int, scan_limit: int) -> tuple[list[bytes], int]:
        """Scan the newest `scan_limit` messages of each queue of a topic for a key (a scan, not
        an index: cost grows with scan_limit). Returns (matching records newest first, scanned)."""
        key_b = key.encode()
        found: list[tuple[tuple[int, int], bytes]] = []
        scanned = 0
        for q in range(self.topics.queues(topic)):
            lo, hi = self.store.queue_range(topic, q)
            off = max(lo, hi - scan_limit)
            while off < hi:
                try:
                    res = self.store.read_queue(topic, q, off, 1024, 8 << 20, None)
                except OffsetOutOfRangeError as e:  # retention moved the queue on under us
                    off = e.min_offset
                    continue
                buf = res.records
                for s in record.scan(buf):
                    scanned += 1
                    f = record.header_fields(buf, s)
                    klen = f[14]
                    if klen:
                        start = s + record.HEADER_SIZE + f[12] + f[13]
                        raw = bytes(buf[start:start + klen])
                        if key_b in raw and key in raw.decode().split(record.KEY_SEPARATOR):
                            # store time (ms), then log position: records stored in the same
                            # millisecond still come newest first
                            found.append(((f[10], f[5]), bytes(buf[s:s + f[0]])))
                if res.next_offset <= off:
                    break
                off = res.next_offset
        found.sort(key=lambda x: x[0], reverse=True)
        return [r for _, r in found[:max_results]], scanned

    async def on_query_by_key(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        topic, key = _str(h, "topic"), _str(h, "key")
        max_results = max(1, min(_int(h, "max", 32), 1000))
        scan_limit = max(1, min(_int(h, "scan_limit", 100_000), 10_000_000))
        self.topics.queues(topic)
        # Store reads are thread-safe by contract; a long scan must not stall the event loop.
        records, scanned = await run_to_end(self.find_by_key, topic, key, max_results, scan_limit)
        return frame.response({"count": len(records), "scanned": scanned}, b"".join(records))

    async def on_broker_info(self, conn: ServerConnection, frame: Frame) -> Frame:
        from equeue_core import __version__

        return frame.response({
            "address": f"{self.address[0]}:{self.address[1]}", "store": self.config.store,
            "transport": self.config.transport, "flush": self.config.flush,
            "version": __version__, "data_dir": os.path.abspath(self.config.data_dir),
            "recovery": {"clean": self.recovery.clean, "truncated_bytes": self.recovery.truncated_bytes,
                         "rebuilt_entries": self.recovery.rebuilt_entries,
                         "rebuilt": [[r.topic, r.queue_id, r.first_offset, r.last_offset]
                                     for r in self.recovery.rebuilt],
                         "lost": [[r.topic, r.queue_id, r.first_offset, r.last_offset]
                                  for r in self.recovery.lost]},
            "stats": dict(self.stats), "held_pulls": self.hold.held,
            "replication": self.replication.status().to_dict(),
            "scheduler": self.scheduler.stats()})


async def run_broker(config: Config, ready: Callable[[Broker], None] | None = None,
                     stop_event: asyncio.Event | None = None) -> None:
    """Run a broker until stop_event is set (or forever)."""
    broker = Broker(config)
    await broker.start()
    try:
        if ready:
            ready(broker)
        await (stop_event or asyncio.Event()).wait()
    finally:
        await broker.stop()


__all__ = ["Broker", "run_broker", "framing"]
