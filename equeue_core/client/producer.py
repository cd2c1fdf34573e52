"""Producers: route each message to a queue, batch per queue, send a batch as one frame.

A batch body is the stored record layout already (record.py), so the broker stamps and appends it
without re-encoding. `send` waits for its own result; `send_async` returns a future and lets
messages sent within `linger_ms` of each other (or up to `max_batch_bytes`) share one frame, at
most `max_batches_in_flight` frames unanswered with one broker (docs/client.md); `send_batch`
sends a list as one frame per topic.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from equeue_core import record
from equeue_core.client import send_multi
from equeue_core.client.connection import DEFAULT_TIMEOUT, BrokerConnection, raise_for_error
from equeue_core.client.credentials import credentials
from equeue_core.client.direct import DirectConnection
from equeue_core.client.fault import LatencyFaultTolerance
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.client.message import Message, SendResult, append_record, append_records, msg_ids
from equeue_core.client.queue_spread import QueueSpread
from equeue_core.client.routing import DEFAULT_ROUTE_REFRESH_S, BrokerQueue, ClusterRouter, writable_queues
from equeue_core.codes import Code
from equeue_core.errors import (
    BrokerBusyError,
    ClientClosedError,
    EQueueError,
    InvalidMessageError,
    RequestTimeoutError,
    TopicNotFoundError,
    TransportError,
    UnknownRequestError,
)
from equeue_core.frame import encode_header
from equeue_core.plugins import get_plugin_manager
from equeue_core.strategies.selectors import RoundRobin

log = logging.getLogger("equeue.producer")

ROUTE_TTL_S = 30.0
_SEND = int(Code.SEND)
_SEND_MULTI = int(Code.SEND_MULTI)
MAX_FRAME_BODY = 15 * 1024 * 1024
LANE_DEPTH = 4  # send_async frames on a Producer's thread lane at most (_ThreadLane) ...
# ... unless the caller is sparse: a message LANE_SPARSE_GAP_S or more after the lane's last one
# goes on it up to LANE_SPARSE_DEPTH frames (a paced stream whose broker is slow for a moment)
LANE_SPARSE_DEPTH = 64
LANE_SPARSE_GAP_S = 100e-6
# A larger record goes the loop path: the lane writes a frame in one non-blocking send or not at
# all, and a frame the kernel takes only part of costs the lane its connection
LANE_MAX_RECORD = 64 * 1024
MAX_CACHED_HEADERS = 4096  # (topic, queue id) SEND headers a Producer keeps encoded (then starts over)
# one whole record per call, the compiled one when built (record.py picks it at import; the same
# bytes as append_record: tests/test_producer_encoding.py)
_encode_record = record.encode_record
_monotonic = time.monotonic


@dataclass
class _Route:
    """Where a topic's messages may go: queue ids of the one broker, or (with nameserver=) the
    BrokerQueue of every writable queue of every broker that has the topic."""

    queues: list[Any]
    id_prefix: str
    fetched: float
    # with the default selector and one broker: which queue the topic's next batch goes to
    # (client/queue_spread.py), kept over a refresh that finds the same queues
    spread: QueueSpread | None = None


_FUTURE_LOCK = threading.Lock()  # a batch's future made on demand, atomically with its outcome


def _leave(obj: Any) -> Any:
    return obj


# Objects left out of the cyclic GC until something can put them in a cycle (_OpenBatch); with
# EQUEUE_PURE_PYTHON=1 (or no C compiler) everything stays tracked
_gc_untrack: Callable[[Any], Any] = _leave
_gc_track: Callable[[Any], Any] = _leave
if record.native is not None and record.native_module is not None:
    _gc_untrack, _gc_track = record.native_module.gc_untrack, record.native_module.gc_track


class _OpenBatch:
    """The send_async messages of one frame, and its outcome. The concurrent.futures.Future
    their SendFutures wait on is made only when someone waits (result() before the answer,
    add_done_callback, await): a batch answered before anyone asks costs no Future (with its
    Condition and lock), which with many topics and small frames was a fifth of the caller's CPU.

    Left out of the cyclic GC (with the compiled hot path), as its futures are (SendFuture): a
    producer that keeps its futures keeps their batches, and over 100 topics a batch holds ~10
    messages, so the batches and their answers were most of what each collection scanned and
    promoted. What a batch references can be in no cycle (records, ints, strs, the answer, its
    producer's bound method until it is answered) except its error (a traceback's frames) and
    its Future's done callbacks: the batch is tracked again when it gets an error (`resolve`),
    and by SendFuture._track() before a callback or an await is put on its Future."""

    __slots__ = ("queue", "parts", "size", "count", "answer", "error", "done", "_future", "waited")

    def __init__(self, queue: Any = None, waited: Callable[[], None] | None = None) -> None:
        self.queue = queue  # the queue id (a BrokerQueue with nameserver=) the whole batch goes to
        # called (on the waiting thread) when someone first waits on the batch before its
        # answer: AsyncProducer._someone_waits sends every gathering batch now
        self.waited = waited
        self.parts: list[bytes] | tuple[()] = []  # the records' buffers (message.append_record); () once sent
        self.size = 0
        self.count = 0  # messages in the batch
        # The outcome, set once by resolve() (answer and error before done, so a reader that sees
        # done without the lock sees them too)
        self.answer: _BatchAnswer | None = None
        self.error: BaseException | None = None
        self.done = False
        self._future: concurrent.futures.Future | None = None
        _gc_untrack(self)
        _gc_untrack(self.parts)  # only ever bytes

    def future(self) -> concurrent.futures.Future:
        """The future of the outcome (made now if nobody asked before; already set if done). The
        first wait before the answer sends what gathers (see `waited`)."""
        f = self._future
        if f is None:
            waited = None
            with _FUTURE_LOCK:
                f = self._future
                if f is None:
                    f = concurrent.futures.Future()
                    if self.done:
                        self._settle(f)
                    else:
                        waited = self.waited
                    self._future = f
            if waited is not None:
                waited()
        return f

    def _settle(self, f: concurrent.futures.Future) -> None:
        if self.error is not None:
            f.set_exception(self.error)
        else:
            f.set_result(self.answer)

    def resolve(self, answer: _BatchAnswer | None, error: BaseException | None) -> None:
        """The outcome (once, on the loop thread): an answer, or the error every message fails with."""
        if error is not None:  # its traceback's frames may lead back here (see the class)
            _gc_track(self)
        if answer is not None:  # strs, ints and a list of ints: in no cycle
            _gc_untrack(answer)
            _gc_untrack(answer.positions)
        with _FUTURE_LOCK:
            self.answer = answer
            self.error = error
            self.done = True
            self.waited = None  # (only asked before the answer) the batch no longer reaches its producer
            f = self._future
        if f is not None:
            self._settle(f)

    @staticmethod
    def resolve_stored(items: Sequence[tuple[tuple[str, Any, bool], _OpenBatch]], id_prefix: str,
                       stored: Sequence[tuple[int, list[int]]]) -> None:
        """`resolve` for every batch of an answered SEND_MULTI whose sections were all stored
        (`stored`: each section's first offset and positions, in order), in one turn of the lock.
        With many topics a frame carries a hundred small batches, and a lock turn and a call
        each were a third of what the loop thread paid a batch."""
        waited = []
        untrack = _gc_untrack
        with _FUTURE_LOCK:
            for (key, batch), (first, positions) in zip(items, stored, strict=True):
                batch.answer = untrack(_BatchAnswer(key[0], batch.queue, id_prefix, first, untrack(positions)))
                batch.done = True
                batch.waited = None
                if batch._future is not None:
                    waited.append(batch)
        for batch in waited:
            batch._settle(batch._future)


@dataclass(slots=True)
class _BatchAnswer:
    """A broker's answer to one SEND: enough to build each message's SendResult on demand."""

    topic: str
    queue_id: int
    id_prefix: str
    first_offset: int
    positions: list[int]
    broker: str = ""
    ids: list[str] | None = None  # every message's msg id, made (in one call) when a first is asked for

    def result(self, i: int) -> SendResult:
        ids = self.ids
        if ids is None:  # two threads may both make them: the same strings
            ids = self.ids = msg_ids(self.id_prefix, self.positions)
        return SendResult(ids[i], self.topic, self.queue_id, self.first_offset + i, self.broker)

    def results(self) -> list[SendResult]:
        if _native_send_results is not None:  # the same results, none of them tracked by the GC
            return _native_send_results(self.id_prefix, self.positions, self.topic, self.queue_id,
                                        self.first_offset, self.broker)
        topic, queue_id, first, broker = self.topic, self.queue_id, self.first_offset, self.broker
        return [SendResult(msg_id, topic, queue_id, first + i, broker)
                for i, msg_id in enumerate(msg_ids(self.id_prefix, self.positions))]


def _cached_send_header(cache: dict[tuple[str, int], tuple[dict[str, Any], bytes]], topic: str,
                        queue_id: int) -> tuple[dict[str, Any], bytes]:
    """The plain SEND header of (topic, queue id) and its encoded bytes (frame.encode_header), kept
    in `cache`: a producer sends to few queues, and past MAX_CACHED_HEADERS the cache starts over.
    Callers that sign sign a copy (signing.sign), so the cached map stays plain."""
    cached = cache.get((topic, queue_id))
    if cached is None:
        if len(cache) >= MAX_CACHED_HEADERS:
            cache.clear()
        header = {"topic": topic, "queue_id": queue_id}
        cached = cache[(topic, queue_id)] = (header, encode_header(header))
    return cached


class _ThreadLane:
    """A blocking Producer's thread lane (AsyncProducer._send_on_lane): a connection of its own
    that callers' threads write a send_async frame of one message on, with no hop through the loop
    thread, while every unanswered message of the producer is on it: at most LANE_DEPTH of them,
    or LANE_SPARSE_DEPTH for a message that comes LANE_SPARSE_GAP_S or more after the lane's last
    one. A caller sending back to back soon batches on the main connection; a sparse one (a paced
    stream) keeps to the lane while its broker is slow for a moment, instead of its messages
    waiting behind a gathering batch (p99 at 5k msg/s, docs/benchmarks.md).

    Its state is one object, not producer attributes: CPython 3.11 keeps an instance's attributes
    in a shared-key dict only up to 30 of them, and past that every attribute read of the
    producer's hot path is slower (`_enqueue` +7 %, measured: 0.93 against 0.87 µs)."""

    __slots__ = ("conn", "wanted", "opening", "keys", "out", "headers", "idle", "frames", "last")

    def __init__(self, headers: dict[tuple[str, int], tuple[dict[str, Any], bytes]]) -> None:
        self.conn: Any = None  # the BrokerConnection, once open_thread_lane opened it
        self.wanted = True  # not opened yet: the first dispatch opens it (in the background)
        self.opening: asyncio.Future | None = None
        # under the producer's _lock: the batch keys with frames on the lane, and how many. While
        # a key has one there its next batch gathers and leaves, on the main connection, when the
        # last is answered (_lane_done), so a queue's frames never overtake each other
        self.keys: dict[tuple[str, Any, bool], int] = {}
        self.out = 0  # frames on the lane (under _lock)
        self.headers = headers  # the Producer's SEND header cache (_cached_send_header), shared
        self.idle: asyncio.Future | None = None  # flush() waiting for the lane (loop thread)
        self.frames = 0  # frames the lane carried (Producer.lane_frames)
        self.last = 0.0  # time.monotonic() of the lane's last write (_send_on_lane)


def _python_result(future: Any, timeout: float | None = None) -> SendResult:
    """SendFuture.result: the message's SendResult, once its batch is answered (waiting up to
    `timeout` s for that), or the send's error. The compiled BatchSlot.result answers itself when
    the batch is answered and its msg ids are made, and calls this for everything else."""
    batch = future._batch
    answer = batch.answer
    if answer is None:
        try:
            answer = batch.future().result(timeout)
        except BaseException:
            # the error's traceback holds this frame, and so the future: a cycle through it from
            # its batch (batch.error), which the collector must see (BatchSlot in _native.c)
            future._track()
            raise
    return answer.result(future._index)


class _PyBatchSlot:
    """A message's place in a batch: what the compiled record hot path's BatchSlot is, in Python
    (EQUEUE_PURE_PYTHON=1 or no C compiler)."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _OpenBatch, index: int) -> None:
        self._batch = batch
        self._index = index

    def _track(self) -> None:
        """The compiled slot's _track(), for the batch: with the Python slot every batch stays tracked."""

    result = _python_result


# One of these per send_async call: made in C when the hot path is built (no __init__ frame), whose
# result() builds the SendResult in C once the batch is answered
_BatchSlot: Any = record.native.BatchSlot if record.native is not None else _PyBatchSlot
# _BatchAnswer.results in C when SendResult binds as plain slots (None: the Python version)
_native_send_results: Callable[..., list[SendResult]] | None = None
if record.native_module is not None and record.native_module._bind_send_future(
        _python_result, SendResult, tuple(f.name for f in fields(SendResult))) == "slots" \
        and record.native is not None:  # EQUEUE_PURE_PYTHON=1: the Python versions throughout
    _native_send_results = record.native_module.send_results


class SendFuture(_BatchSlot):
    """The future of one automatically batched message: SendFuture(batch, index). Messages of a
    batch share one underlying future, so batching does not cost a future (or a result object)
    per message until someone asks for it. Offers result(), exception(), done(),
    add_done_callback() like concurrent.futures.Future, and can be awaited from asyncio code. A
    result asked for once the batch is answered comes from the batch's answer directly (no lock,
    no wait)."""

    __slots__ = ()

    # result(timeout=None) -> SendResult: the base's (_python_result; in C when built)

    # A compiled slot is born untracked by the cyclic GC (_native.c BatchSlot): every call below
    # that can put this future in a reference cycle through its batch tracks it first.

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self._batch
        error = batch.error if batch.done else batch.future().exception(timeout)
        if error is not None:  # raised by the caller, its traceback may hold a frame with this future
            self._track()
        return error

    def done(self) -> bool:
        return self._batch.done

    def add_done_callback(self, fn: Any) -> None:
        """fn(this future) once the message is answered or failed (at once if it is already)."""
        self._track()  # the batch's Future keeps the callback, which keeps this future
        self._batch.future().add_done_callback(lambda _f: fn(self))

    def __await__(self):
        self._track()  # the awaiting task (this frame) hangs off the batch's Future meanwhile
        answer = yield from asyncio.wrap_future(self._batch.future()).__await__()
        return answer.result(self._index)


class _Sending:
    """The producer's batches out on the loop path (loop thread): those on the task path
    (`_send_open_batch` tasks) and those `_send_now` wrote in the turn that dispatched them, whose
    answers come to a callback (`_answered_now`); flush()'s wait for the latter; the SEND header
    cache; the bound `_someone_waits` every batch is given. One object, not producer attributes
    (see _ThreadLane)."""

    __slots__ = ("tasks", "now", "idle", "headers", "multi", "multi_frames", "waited")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Future] = set()  # batches on the task path
        self.now = 0  # frames written by _send_now or _send_multi and not yet settled
        # whether the broker takes SEND_MULTI (False once it answered unknown_request), and how
        # many such frames went (AsyncProducer.multi_frames)
        self.multi = True
        self.multi_frames = 0
        self.idle: asyncio.Future | None = None  # flush() waiting for `now` to reach 0
        # (topic, queue id) -> SEND header and its bytes (_cached_send_header); the blocking
        # Producer's direct sends and thread lane share it
        self.headers: dict[tuple[str, int], tuple[dict[str, Any], bytes]] = {}
        # AsyncProducer._someone_waits, bound once: a bound method made per batch (over 100
        # topics one send_async in ten opens a batch) lived until its answer, and was most of
        # what the collector promoted then (docs/benchmarks.md, "Futures the collector need not count")
        self.waited: Callable[[], None] | None = None


def _settled(topic: str, queue: Any, request: Any) -> tuple[_BatchAnswer | None, BaseException | None]:
    """A callback request's outcome (request_now, write_from_thread) as a batch's: the answer, or
    the error (a TransportError, or the broker's error answer raised as its type)."""
    err = request.exception()
    if err is not None:
        return None, err
    try:
        h = raise_for_error(request.result()).header
    except EQueueError as e:
        return None, e
    return _BatchAnswer(topic, queue, h["id_prefix"], h["first_offset"], h["positions"]), None


class AsyncProducer:
    """The asyncio producer; also the engine of the blocking Producer (on the background loop)."""

    def __init__(self, broker: str = "127.0.0.1:10911", selector: str = "round_robin",
                 linger_ms: float = 1.0, max_batch_bytes: int = 512 * 1024,
                 send_timeout: float = DEFAULT_TIMEOUT, retries: int = 2,
                 max_in_flight: int = 200_000, *, nameserver: str | None = None,
                 route_refresh_s: float = DEFAULT_ROUTE_REFRESH_S, fault_base_s: float = 1.0,
                 fault_max_s: float = 60.0, access_key: str | None = None,
                 secret_key: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None,
                 curve_server_key: str | None = None, curve_public_key: str | None = None,
                 curve_secret_key: str | None = None, max_batches_in_flight: int = 8) -> None:
        """`max_batches_in_flight`: with one broker, the send_async frames sent and not yet
        answered at most (a batch is a frame); while that many are out, batches that are ready
        wait for the next answer and keep gathering messages (see _send_open)."""
        self.broker = broker
        self._credentials = credentials(access_key=access_key, secret_key=secret_key, tls_ca=tls_ca,
                                        tls_cert=tls_cert, tls_key=tls_key, curve_server_key=curve_server_key,
                                        curve_public_key=curve_public_key, curve_secret_key=curve_secret_key)
        # with nameserver=: routes from the name servers, one connection per broker, and the
        # brokers that failed avoided for a while (client/routing.py, client/fault.py)
        self._router = (ClusterRouter(nameserver, route_refresh_s, min(5.0, send_timeout),
                                      credentials=self._credentials,
                                      fault=LatencyFaultTolerance(fault_base_s, fault_max_s))
                        if nameserver else None)
        self.route_ttl = route_refresh_s if nameserver else ROUTE_TTL_S
        self.linger = linger_ms / 1000.0
        self.max_batch_bytes = max_batch_bytes
        self.send_timeout = send_timeout
        self.retries = retries
        self._default_selector = get_plugin_manager().queue_selector(selector)()
        self._hash_selector = get_plugin_manager().queue_selector("hash")()
        self._routes: dict[str, _Route] = {}
        self._conn: BrokerConnection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The lock guards _open (the callers add to it, the loop thread takes batches out of it)
        # and _enqueued. The loop thread takes it once per answered batch (and per linger check),
        # not per message: whatever only the loop thread writes (_in_flight, _linger_armed,
        # _released) it writes without it. And the usual paths of its critical sections make no
        # call (dict and attribute operations only): CPython hands the GIL to another thread only
        # at a call or a backward jump, so a thread holding the lock is not switched out, and the
        # other thread never sleeps on the lock only to wake the holder (a caller paid ~10 % of
        # its CPU in those wake-ups).
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # callers waiting for room under max_in_flight
        self._open: dict[tuple[str, Any, bool], _OpenBatch] = {}
        # Full batches a caller took out of _open and the loop thread has not sent yet, per key,
        # oldest first (under _lock). Every path that sends a key's open batch sends these first
        # (_take_batches): a batch opened after a full one never leaves before it.
        self._sealed: dict[tuple[str, Any, bool], list[_OpenBatch]] = {}
        # batches sent and not yet answered, per batch key (the loop thread writes it; callers read
        # it under _lock): a new batch leaves at once while its key has none in flight, else when
        # the last one is answered (_answered deletes a key under _lock)
        self._in_flight: dict[tuple[str, Any, bool], int] = {}
        self._linger_armed: set[tuple[str, Any, bool]] = set()  # keys with a _linger_check pending (loop thread)
        self.max_in_flight = max_in_flight
        self._enqueued = 0  # messages ever queued (callers, under _lock)
        self._released = 0  # of those, answered or failed (the loop thread only)
        self._room_waiters = 0  # callers waiting in _room (under _lock)
        # One broker: at most max_batches_in_flight frames out (the loop thread counts them); keys
        # whose open batch is ready to go wait in _deferred, in order, for the next answer
        self.max_batches_in_flight = max(1, max_batches_in_flight)
        self._frames = 0
        self._deferred: dict[tuple[str, Any, bool], None] = {}
        self._sending = _Sending()  # batches out on the loop path
        self._sending.waited = self._someone_waits
        self._closed = False
        self._lane: _ThreadLane | None = None  # the blocking Producer gives it one (_ThreadLane)

    @property
    def nameserver(self) -> str | None:
        """The name servers given (None: one broker). Kept on the router, not here: see
        _ThreadLane on why the producer's own attributes stay few."""
        return None if self._router is None else self._router.nameserver

    @property
    def _pending(self) -> int:
        """Messages queued and not yet answered or failed (read without the lock: a moment stale)."""
        return self._enqueued - self._released

    async def start(self) -> AsyncProducer:
        self._loop = asyncio.get_running_loop()
        if self._router is None:
            self._conn = await BrokerConnection(self.broker, **self._credentials).connect()
            # SEND_MULTI goes only through request_now: without it (zmq) batches are packed for
            # nothing, and a packed frame sent as single frames would pass max_batches_in_flight
            self._sending.multi = self._conn.callback_requests
        else:
            await self._router.nameservers.cluster_info()  # fail at start if no name server answers
        return self

    # ---------------------------------------------------------------- routing

    async def route(self, topic: str, refresh: bool = False) -> _Route:
        r = self._routes.get(topic)
        if self._router is not None:
            if r is None or refresh or time.monotonic() - r.fetched > self.route_ttl:
                queues = writable_queues(await self._router.route(topic, refresh))
                if not queues:
                    raise TopicNotFoundError(f"topic {topic!r} has no writable queue on any live broker")
                r = self._routes[topic] = _Route(queues, "", time.monotonic())
            return r
        if r is None or refresh or time.monotonic() - r.fetched > ROUTE_TTL_S:
            assert self._conn is not None, "call start() first"
            h = (await self._conn.request(Code.ROUTE, {"topic": topic, "create": True})).header
            queues = list(range(h["queues"]))
            spread = None
            if type(self._default_selector) is RoundRobin:  # batches spread by messages
                spread = r.spread if r is not None and r.spread is not None and r.queues == queues \
                    else QueueSpread(queues)
            r = self._routes[topic] = _Route(queues, h["id_prefix"], time.monotonic(), spread)
        return r

    def _select(self, route: _Route, routing_key: str | None) -> Any:
        """A queue id, or with nameserver= a BrokerQueue. A routing key hashes over every queue of
        the route (one key, one queue while the route stands: per-key order); otherwise the
        selector chooses among the queues of the brokers fault tolerance does not avoid."""
        if routing_key is not None:
            return self._hash_selector.select(route.queues, routing_key)
        if self._router is None or not self._router.fault.has_faults():
            return self._default_selector.select(route.queues, None)
        ok = self._router.fault.preferred({q.broker for q in route.queues})
        queues = route.queues if len(ok) == len({q.broker for q in route.queues}) else \
            [q for q in route.queues if q.broker in ok]
        return self._default_selector.select(queues, None)

    # ---------------------------------------------------------------- batching

    def _join_open(self, message: Message) -> SendFuture | None:
        """The usual `send_async` under load, in one frame: a plain message (bytes body, no keys,
        properties, delay or routing key; one broker) joins its topic's open batch. None when
        there is none, it would fill it, the producer has no room under max_in_flight or is
        closed: then `_enqueue`, which does the same join in its usual branch and everything else.

        Why a second way in: `send_async` -> `_enqueue` -> `append_record` -> the compiled encode
        cost a caller ~1.8 us a message, this ~1.5 us, and the caller's thread is what limits
        `send_async` throughput (docs/benchmarks.md, "`send_async`: sealed full batches, and the
        open batch joined in one frame"). The message gets the same place as through `_enqueue`:
        the open batch of its key, under the same lock, with no call in the critical section
        (see _lock). It never fills a batch, so sealing and sending stay `_enqueue`'s, and the
        route is not looked at: a joined batch already has its queue (a route past its TTL is
        refreshed when the next batch opens)."""
        open_ = self._open
        key = (message.topic, None, False)
        body = message.body
        if (key not in open_ or self._closed or message.keys or message.properties
                or type(body) is not bytes):
            return None
        rec = _encode_record(message.topic, body, message.tag, (), None, 0)
        size = len(rec)
        with self._lock:
            if key in open_ and self._enqueued - self._released < self.max_in_flight:
                batch = open_[key]
                size += batch.size
                if size < self.max_batch_bytes:
                    self._enqueued += 1
                    index = batch.count
                    batch.count = index + 1
                    batch.parts += (rec,)
                    batch.size = size
                    return SendFuture(batch, index)
        return None

    def _enqueue(self, route: _Route, message: Message, routing_key: str | None,
                 linger: bool = True) -> SendFuture:
        """Add a message to an open batch (any thread); returns its result future. Without
        linger the batch goes at the loop's next turn, taking whatever joined it by then.

        A message with a routing key joins the open batch of its queue (per-key order). With one
        broker, one without joins the topic's one open batch, whose queue was chosen when the
        batch was opened (sticky per batch, like Kafka's sticky partitioner; _new_batch_queue):
        batches stay as large with 1000 queues as with 4, and batch after batch still spreads
        over every queue, evenly in messages with the default selector.
        With nameserver= the selector still picks per message (round robin over the brokers'
        queues message by message, as docs/cluster.md promises)."""
        if self._closed:
            raise ClientClosedError("the producer is closed")
        parts: list[bytes] = []
        if routing_key is None and self._router is None:  # the usual call: the batch picks the queue
            queue = None
            pinned = False
            # the broker stamps the queue id into every record it stores, so 0 is fine until then
            size = append_record(parts, message, 0)
        else:
            pinned = routing_key is not None
            queue = self._select(route, routing_key)
            size = append_record(parts, message, queue if isinstance(queue, int) else queue.queue_id)
        key = (message.topic, queue, pinned)
        open_ = self._open
        # No call in the usual path of this critical section (see _lock in __init__)
        with self._lock:  # the lock of self._room (its own __enter__ is a Python-level call)
            if self._enqueued - self._released >= self.max_in_flight:
                self._wait_for_room()
            if key in open_:  # the usual case under load (and then the lane is out of the question)
                batch = open_[key]
                new = False
            elif (lane := self._lane) is not None and lane.conn is not None and queue is None \
                    and size <= LANE_MAX_RECORD and self._enqueued - self._released == lane.out \
                    and (lane.out < LANE_DEPTH  # (the clock only past it: not the usual path)
                         or (lane.out < LANE_SPARSE_DEPTH and _monotonic() - lane.last >= LANE_SPARSE_GAP_S)):
                # Every unanswered message is on the thread lane (none, when idle): this one too.
                # Its key may still be in _in_flight with its frames all answered (released:
                # _answered runs a loop turn later); _answered leaves what gathers to _lane_done.
                lane.out += 1
                keys = lane.keys
                keys[key] = keys[key] + 1 if key in keys else 1
                batch = _OpenBatch(self._new_batch_queue(route, None))
                new = None
            else:
                new = True
                idle = key not in self._in_flight and not self._on_lane(key)
                batch = open_[key] = _OpenBatch(queue, self._sending.waited)
                if queue is None:
                    batch.queue = self._new_batch_queue(route, batch)
            self._enqueued += 1
            index = batch.count
            batch.count = index + 1
            batch.parts += parts
            size += batch.size
            batch.size = size
            full = size >= self.max_batch_bytes and new is not None
            if full:  # sealed: it leaves before anything of its key opened after it
                del open_[key]
                sealed = self._sealed
                if key in sealed:
                    sealed[key] += (batch,)
                else:
                    sealed[key] = [batch]
                if self._on_lane(key):  # after the lane's frames (_lane_done)
                    full = new = False
        if new is None:
            return self._send_on_lane(key, batch, message.topic)
        loop = self._loop
        assert loop is not None
        if full:
            loop.call_soon_threadsafe(self._send_sealed, key)
        elif new and (idle or not linger):
            loop.call_soon_threadsafe(self._linger_expired, key, batch)
        # else: a batch of this key is in flight; the batch leaves when it is answered, or at the
        # key's next linger check (_linger_check), whichever comes first: no wake-up of the loop
        # thread from here (each one costs both threads a switch)
        return SendFuture(batch, index)

    def _new_batch_queue(self, route: _Route, batch: _OpenBatch | None) -> Any:
        """With _lock held: the queue of a batch without a routing key that opens now (batch None:
        one message on the thread lane). With the default selector and one broker the queue this
        producer sent the fewest messages of the topic to (client/queue_spread.py), else the
        selector's choice."""
        spread = route.spread
        if spread is None:
            return self._select(route, None)
        return spread.queue_for() if batch is None else spread.queue_for_batch(batch)

    def _queue_for_sending(self, route: _Route, routing_key: str | None, count: int) -> Any:
        """The queue of a `send_batch` call's `count` messages of one topic (direct or through the
        loop): a routing key's hash; else with a spread (the default selector, one broker) the
        queue this producer sent the fewest messages of the topic to, counted now (under _lock,
        which the callers' threads share with the loop thread), else the selector's choice."""
        spread = route.spread
        if routing_key is not None or spread is None:
            return self._select(route, routing_key)
        with self._lock:
            return spread.queue_for(count)

    def _wait_for_room(self) -> None:
        """With _lock held: wait until fewer than max_in_flight messages are unanswered. The count
        is checked again after registering as a waiter, so a release in between (which notifies
        only while someone waits, see _release) is never missed."""
        self._room_waiters += 1
        try:
            while self._enqueued - self._released >= self.max_in_flight:
                if not self._room.wait(self.send_timeout):
                    raise BrokerBusyError(f"{self._pending} messages waiting to be sent; the broker is not keeping up")
        finally:
            self._room_waiters -= 1

    def _linger_check(self, key: tuple[str, Any, bool]) -> None:
        """Every `linger` while batches of `key` are in flight (armed by _dispatch): the batch that
        opened meanwhile leaves now, so none waits longer than `linger` for an answer."""
        self._linger_armed.discard(key)
        if key not in self._in_flight or self._on_lane(key):
            return  # _answered sent whatever had gathered, or it leaves after the lane's frames
        if not self._frame_room():
            self._deferred[key] = None  # leaves with the next answer (_dispatch arms the next check)
            return
        with self._lock:
            waiting = self._take_batches(key)
        for batch in waiting:
            self._dispatch(key, batch)
        if not waiting:
            self._linger_armed.add(key)
            assert self._loop is not None
            self._loop.call_later(self.linger, self._linger_check, key)

    def _linger_expired(self, key: tuple[str, Any, bool], batch: _OpenBatch) -> None:
        """A new batch of a key with nothing in flight (or one asked not to linger): it leaves at
        once, or with the next answer while max_batches_in_flight frames are out."""
        if self._open.get(key) is batch:
            self._send_open(key)

    def _frame_room(self) -> bool:
        return self._router is not None or self._frames < self.max_batches_in_flight

    def _send_open(self, key: tuple[str, Any, bool]) -> None:
        """On the loop thread: the open batch of `key` leaves now; or, while max_batches_in_flight
        frames are unanswered, with the next answer (_drain_deferred), having gathered whatever
        came meanwhile. Why: with many topics (or routing keys) each key's batch is small, and
        a frame per key per round trip costs both ends far more than the bytes; frames waiting
        here become fewer and fuller, where the broker would have queued them anyway."""
        if self._on_lane(key):
            return  # the lane's frames of this key are out: _lane_done sends this batch after them
        if not self._frame_room():
            self._deferred[key] = None
            return
        with self._lock:
            batches = self._take_batches(key)
        for batch in batches:
            self._dispatch(key, batch)

    def _send_sealed(self, key: tuple[str, Any, bool]) -> None:
        """On the loop thread: a caller sealed a full batch of `key` (_enqueue). It leaves now,
        after any sealed before it; a path that sent them already leaves nothing to do here."""
        if self._on_lane(key):
            return  # _lane_done sends them after the lane's frames
        sealed = self._sealed
        with self._lock:
            batches = sealed.pop(key) if key in sealed else ()
        for batch in batches:
            self._dispatch(key, batch)

    def _take_batches(self, key: tuple[str, Any, bool]) -> list[_OpenBatch]:
        """With _lock held, on the loop thread: the batches of `key` that may leave, in the order
        they must: the sealed ones, oldest first, then the open one (each taken out)."""
        sealed = self._sealed
        batches = sealed.pop(key) if key in sealed else []
        open_ = self._open
        if key in open_:
            batches.append(open_.pop(key))
        return batches

    def _take_deferred(self) -> list[list[tuple[tuple[str, Any, bool], _OpenBatch]]]:
        """With _lock held, on the loop thread: the batches of the waiting keys, oldest first, as
        the frames they leave in (the caller sends them: _dispatch_frames), as many frames as
        there is room for. With one broker that takes SEND_MULTI a frame carries the open
        batches of as many keys as fit in `max_batch_bytes` (client/send_multi.py); else a
        frame is one batch."""
        deferred = self._deferred
        if self._router is not None:
            room = len(deferred)
            limit = 0  # a frame per batch
        else:
            room = self.max_batches_in_flight - self._frames
            limit = self.max_batch_bytes if self._sending.multi else 0
        open_ = self._open
        sealed = self._sealed
        lane_keys = self._lane.keys if self._lane is not None else {}
        joins = send_multi.joins
        frames: list[list[tuple[tuple[str, Any, bool], _OpenBatch]]] = []
        frame: list[tuple[tuple[str, Any, bool], _OpenBatch]] = []
        size = 0
        done = 0  # the keys looked at, from the front: taken, or dropped as not waiting here
        # One walk over the keys, taken out of `deferred` at the end (deleting each from the
        # front as it was taken made every next(iter()) step over the holes left before it)
        for key in deferred:
            if key in lane_keys or (key not in open_ and key not in sealed):
                done += 1  # it leaves after the lane's frames (_lane_done), or already left
                continue
            batch = open_.get(key)
            if frames and batch is not None and key not in sealed and joins(frame, size, batch.size, limit):
                del open_[key]  # the usual case with many topics: one batch into the frame packing
                frame.append((key, batch))
                size += batch.size
            elif len(frames) >= room:
                break
            else:
                frame = [(key, b) for b in self._take_batches(key)]
                frames.append(frame)
                size = sum(b.size for _, b in frame)
            done += 1
        if done == len(deferred):
            deferred.clear()
        else:
            for key in list(itertools.islice(deferred, done)):
                del deferred[key]
        return frames

    def _dispatch(self, key: tuple[str, Any, bool], batch: _OpenBatch) -> None:
        """On the loop thread: send a batch taken out of _open."""
        lane = self._lane
        if lane is not None and lane.wanted:  # the first send_async frame of a blocking Producer
            self._want_lane()
        if self._router is None:
            self._frames += 1
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        if key not in self._linger_armed:
            self._linger_armed.add(key)
            assert self._loop is not None
            self._loop.call_later(self.linger, self._linger_check, key)
        body = b"".join(batch.parts)
        batch.parts = ()  # the futures keep the batch: not its bytes
        if not self._send_now(key, batch, body):
            self._send_as_task(key, batch, body)

    def _want_lane(self) -> None:
        """The first send_async frame of a blocking Producer opens its thread lane (in the
        background)."""
        lane = self._lane
        assert lane is not None
        lane.wanted = False
        lane.opening = asyncio.ensure_future(self.open_thread_lane())

    def _dispatch_frames(self, frames: list[list[tuple[tuple[str, Any, bool], _OpenBatch]]]) -> None:
        """On the loop thread: send batches taken out of _open and _sealed, in the frames they
        were packed into (_take_deferred, send_multi.pack): a frame of several batches as one
        SEND_MULTI when it can be written now, else (and a frame of one) each batch its own."""
        for items in frames:
            if len(items) == 1 or not self._send_multi(items):
                for key, batch in items:
                    self._dispatch(key, batch)

    @property
    def multi_frames(self) -> int:
        """SEND_MULTI frames sent (client/send_multi.py)."""
        return self._sending.multi_frames

    def _send_multi(self, items: list[tuple[tuple[str, Any, bool], _OpenBatch]]) -> bool:
        """Write several batches as one SEND_MULTI frame now, their answers handled in the
        callback that reads the answer (`_multi_answered`), on `_send_now`'s conditions (one
        broker, nothing on the task path, the connection able to write at once) and while the
        broker takes SEND_MULTI. False: nothing written (each batch then goes on its own).

        Its keys get no linger check (`_linger_check`): what gathers behind them leaves when
        this frame is answered, packed into the next one, so a busy broker gets fewer, fuller
        frames, as Nagle's algorithm makes them. Measured over 100 topics (300k send_async):
        with a linger check every `linger` sending what had gathered (one timer per key, or
        one for the producer), 25-38k sections of ~10 messages and 465-487k msg/s; without,
        16-17k sections and 539-569k msg/s (docs/benchmarks.md, "Many topics in one frame")."""
        sending = self._sending
        conn = self._conn
        if not sending.multi or sending.tasks or conn is None or self._router is not None:
            return False
        lane = self._lane
        if lane is not None and lane.wanted:
            self._want_lane()
        header, body = send_multi.request_of(items)
        try:
            written = conn.request_now(_SEND_MULTI, header, encode_header(header), body, self.send_timeout,
                                       functools.partial(self._multi_answered, items, body))
        except EQueueError:  # FrameTooLargeError: nothing written; each batch goes on its own
            return False
        if not written:
            return False
        sending.now += 1
        sending.multi_frames += 1
        self._frames += 1
        in_flight = self._in_flight
        untrack = _gc_untrack
        for item in items:
            key, batch = item
            in_flight[key] = in_flight.get(key, 0) + 1
            batch.parts = ()  # the futures keep the batch: not its bytes
            untrack(item)  # (a key of strs and a batch) kept until the answer: nothing to scan
        return True

    def _multi_answered(self, items: list[tuple[tuple[str, Any, bool], _OpenBatch]], body: bytes,
                        request: Any) -> None:
        """On the loop thread, in the callback that read the answer to a SEND_MULTI (or saw it
        fail): settle each batch as its own SEND's answer would, then go on as `_answered` does
        for each key. A transport failure counts as every batch's first try: each is sent again
        on its own, on the task path, with the rest of its retries (at least once). A broker
        that does not know SEND_MULTI (unknown_request) stored nothing: the producer stops using
        it and sends each batch on its own."""
        err = request.exception()
        stored = results = None
        if err is None:
            frame = request.result()
            stored = send_multi.all_stored(frame, len(items))
            if stored is None:
                results = send_multi.outcomes(frame, len(items))
                if isinstance(results[0][1], UnknownRequestError):
                    log.info("the broker does not take SEND_MULTI: a frame per batch from now on")
                    self._sending.multi = False
                    err = results[0][1]
        if err is not None:
            self._frames += len(items) - 1  # each batch a frame of its own from here (_answered)
            bodies = send_multi.split(body, [batch.size for _, batch in items])
            for (key, batch), own in zip(items, bodies, strict=True):
                self._send_as_task(key, batch, own, err if isinstance(err, TransportError) else None)
        else:
            self._release(sum(batch.count for _, batch in items))
            if stored is not None:  # the usual answer: every section stored
                _OpenBatch.resolve_stored(items, frame.header["id_prefix"], stored)
            else:
                for (key, batch), (outcome, error) in zip(items, results, strict=True):
                    batch.resolve(None if outcome is None else _BatchAnswer(key[0], batch.queue, *outcome), error)
            self._answered_keys(items)
        sending = self._sending
        sending.now -= 1
        if not sending.now and sending.idle is not None and not sending.idle.done():
            sending.idle.set_result(None)

    def _answered_keys(self, items: list[tuple[tuple[str, Any, bool], _OpenBatch]]) -> None:
        """A SEND_MULTI frame of these batches was answered: `_answered` for each of their keys
        in one turn of the lock. The open batches of keys left with nothing in flight wait with
        the other deferred keys, and whatever there is room for leaves packed again."""
        self._frames -= 1
        in_flight = self._in_flight
        open_ = self._open
        deferred = self._deferred
        lane = self._lane
        ready: Any = ()
        with self._lock:
            for key, _ in items:
                left = in_flight[key] - 1
                if left:
                    in_flight[key] = left
                    continue
                del in_flight[key]
                if key in open_ and not (lane is not None and key in lane.keys):  # else after the lane's frames
                    deferred[key] = None
            if deferred and self._frames < self.max_batches_in_flight:
                ready = self._take_deferred()
        if ready:
            self._dispatch_frames(ready)

    def _send_as_task(self, key: tuple[str, Any, bool], batch: _OpenBatch, body: bytes,
                      failed: TransportError | None = None) -> None:
        """The task path: `_send_open_batch` in a task, `_answered` when it is done."""
        task = asyncio.ensure_future(self._send_open_batch(key, batch, body, failed))
        self._sending.tasks.add(task)
        task.add_done_callback(functools.partial(self._answered, key))

    def _send_now(self, key: tuple[str, Any, bool], batch: _OpenBatch, body: bytes) -> bool:
        """Write the batch's frame in this call, its answer handled in the callback that reads it
        (`BrokerConnection.request_now`), when the transport offers that and nothing could be
        overtaken: one broker, no batch of this producer on the task path (a retry, a write
        waiting for its turn or for a reconnect, which a frame written now would pass), and the
        connection able to write at once. False: nothing written; the task path then sends it.

        Why: through the task path an answer reached `_answered` two loop turns after the read,
        and the next batch's write came a third turn later, with a Task, its coroutines and a
        timer per frame; each turn waits for a GIL switch while the caller's thread holds the
        GIL. The loop thread's CPU a message fell 10-13 % (docs/benchmarks.md, "`send_async`:
        answers in the callback that reads them")."""
        conn = self._conn
        if self._sending.tasks or conn is None or self._router is not None:
            return False
        topic = key[0]
        header, header_b = _cached_send_header(self._sending.headers, topic, batch.queue)
        try:
            written = conn.request_now(_SEND, header, header_b, body, self.send_timeout,
                                       functools.partial(self._answered_now, key, batch, body))
        except EQueueError:  # FrameTooLargeError: nothing written; the task path fails the batch
            return False
        if written:
            self._sending.now += 1
        return written

    def _answered_now(self, key: tuple[str, Any, bool], batch: _OpenBatch, body: bytes, request: Any) -> None:
        """On the loop thread, in the callback that read the answer to a batch `_send_now` wrote
        (or saw it fail): settle the batch and go on as `_answered` does. A transport failure
        counts as the first try: the task path sends the frame again with the rest of its retries
        (at least once: a frame that timed out may have been stored)."""
        answer, err = _settled(key[0], batch.queue, request)
        if isinstance(err, TransportError):
            self._send_as_task(key, batch, body, err)
        else:
            self._release(batch.count)
            batch.resolve(answer, err)
            self._answered(key, None)
        sending = self._sending
        sending.now -= 1
        if not sending.now and sending.idle is not None and not sending.idle.done():
            sending.idle.set_result(None)

    def _answered(self, key: tuple[str, Any, bool], task: asyncio.Future | None) -> None:
        """A batch of `key` was answered (or failed): with none of that key left in flight, the
        batch that gathered meanwhile leaves now instead of waiting out its linger. `task`: the
        task that sent it (None: _send_now wrote it)."""
        self._sending.tasks.discard(task)
        if self._router is None:
            self._frames -= 1
        left = self._in_flight[key] - 1
        deferred = self._deferred
        if left:
            self._in_flight[key] = left
            if not deferred:
                return
        # one turn of the lock for both: the key's own next batch (atomic with a caller's look at
        # _in_flight and its new batch in _open) and the batches waiting for room
        open_ = self._open
        sealed = self._sealed
        room = self._router is not None or self._frames < self.max_batches_in_flight
        batch = None
        first: Any = ()
        ready: Any = ()
        with self._lock:
            if not left:
                del self._in_flight[key]
                if key in open_ and not (self._lane is not None and key in self._lane.keys):  # else after the lane's frames
                    if room and not deferred:  # the usual case, without a call under the lock
                        batch = open_[key]
                        del open_[key]
                        if key in sealed:  # full ones a caller sealed before it opened: first
                            first = sealed[key]
                            del sealed[key]
                    else:
                        deferred[key] = None  # after the keys already waiting for room
            if deferred and room:
                ready = self._take_deferred()
        for b in first:
            self._dispatch(key, b)
        if batch is not None:
            self._dispatch(key, batch)
        if ready:
            self._dispatch_frames(ready)

    async def _send_open_batch(self, key: tuple[str, Any, bool], batch: _OpenBatch, body: bytes,
                               failed: TransportError | None = None) -> None:
        """Send a batch's frame `body`, with retries, and settle it. `failed`: the first try's
        failure (_answered_now), counted among the tries."""
        topic, _, pinned = key
        try:
            answer = await self._send_frame(topic, batch.queue, body, {}, pinned, failed)
        except BaseException as e:
            self._release(batch.count)
            batch.resolve(None, e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self._release(batch.count)
        batch.resolve(answer, None)

    def _release(self, n: int) -> None:
        """On the loop thread: n messages were answered or failed. Wakes callers waiting for
        room (they registered under the lock before checking the count: see _wait_for_room)."""
        self._released += n
        if self._room_waiters:
            with self._room:
                self._room.notify_all()

    async def _send_frame(self, topic: str, queue_id: Any, body: bytes, extra: dict[str, Any],
                          pinned: bool = False, failed: TransportError | None = None) -> _BatchAnswer:
        """One SEND request, retried on transport failures (`failed`: a first try that failed
        before this call, one broker only)."""
        if self._router is not None:
            return await self._send_routed(topic, queue_id, body, extra, pinned)
        assert self._conn is not None
        header = {"topic": topic, "queue_id": queue_id, **extra}
        attempt = 0
        error = failed
        while True:
            if error is not None:
                attempt += 1
                if attempt > self.retries:
                    # the same type (handshake_refused, timeout, ...), so the cause is not lost
                    raise type(error)(f"send to {topic}/{queue_id} failed after {attempt} tries: {error}",
                                      **error.details) from error
                await asyncio.sleep(0.1 * attempt)
            try:
                resp = await self._conn.request(Code.SEND, header, body, self.send_timeout)
                break
            except TransportError as e:
                error = e
        h = resp.header
        return _BatchAnswer(topic, queue_id, h["id_prefix"], h["first_offset"], h["positions"])

    async def _send_routed(self, topic: str, queue: BrokerQueue, body: bytes, extra: dict[str, Any],
                           pinned: bool) -> _BatchAnswer:
        """One SEND over the cluster. A transport failure (dead broker, lost connection, timeout)
        marks the broker failed (avoided for a while), refreshes the route at once and retries,
        up to `retries` times, on a queue of a broker not tried yet (RocketMQ's retry on another
        broker); a `pinned` send (routing key: per-key order) retries only its own queue. After
        the last try the send fails with TransportError naming every broker tried: a message is
        either acknowledged or its future fails, never dropped silently. A timed-out send may
        have been stored, so a retry can duplicate it (at least once)."""
        assert self._router is not None
        tried: list[str] = []
        errors: list[str] = []
        while True:
            started = time.monotonic()
            try:
                conn = await self._router.connection(queue.broker)
                resp = await conn.request(Code.SEND, {"topic": topic, "queue_id": queue.queue_id, **extra},
                                          body, self.send_timeout)
            except EQueueError as e:
                if not isinstance(e, TransportError) and e.code != "not_master":
                    raise
                if e.code == "not_master":  # a failover moved the group's master: follow the route to it
                    tried.append(queue.broker)
                    errors.append(f"{queue.broker}: {e}")
                    if len(tried) > self.retries:
                        raise
                    await asyncio.sleep(0.2 * len(tried))
                    queue = await self._retry_queue(topic, queue, [], True)
                    continue
                self._router.fault.failed(queue.broker)
                await self._router.forget_connection(queue.broker)
                tried.append(queue.broker)
                errors.append(f"{queue.broker}: {e}")
                if len(tried) > self.retries:
                    raise TransportError(f"send to {topic} failed after {len(tried)} tries: "
                                         + "; ".join(errors)) from e
                queue = await self._retry_queue(topic, queue, tried, pinned)
                if queue.broker in tried:
                    await asyncio.sleep(0.1 * len(tried))
                continue
            self._router.fault.succeeded(queue.broker, time.monotonic() - started)
            h = resp.header
            return _BatchAnswer(topic, queue.queue_id, h["id_prefix"], h["first_offset"], h["positions"], queue.broker)

    async def _retry_queue(self, topic: str, failed: BrokerQueue, tried: list[str], pinned: bool) -> BrokerQueue:
        """The queue to retry a failed send on, from a freshly fetched route."""
        try:
            route = await self.route(topic, refresh=True)
        except (TransportError, TopicNotFoundError) as e:
            log.warning("route of %s after a failed send: %s", topic, e)
            return failed
        if pinned:
            return failed
        others = [q for q in route.queues if q.broker not in tried]
        if not others:
            return failed if failed in route.queues else route.queues[0]
        ok = self._router.fault.preferred({q.broker for q in others})
        return self._default_selector.select([q for q in others if q.broker in ok], None)

    # ---------------------------------------------------------------- API

    async def send(self, message: Message, routing_key: str | None = None) -> SendResult:
        route = await self.route(message.topic)
        if message.delay_level is not None or message.deliver_at is not None:
            return (await self._send_delayed(route, message, routing_key))
        return await self._enqueue(route, message, routing_key)

    async def _send_delayed(self, route: _Route, message: Message, routing_key: str | None) -> SendResult:
        queue = self._select(route, routing_key)
        extra: dict[str, Any] = {}
        if message.deliver_at is not None:
            extra["deliver_at"] = message.deliver_at_ms()
        else:
            extra["delay_level"] = int(message.delay_level)  # type: ignore[arg-type]
        qid = queue if isinstance(queue, int) else queue.queue_id
        return (await self._send_frame(message.topic, queue, message.encode(qid), extra,
                                       routing_key is not None)).result(0)

    async def send_batch(self, messages: Sequence[Message], routing_key: str | None = None) -> list[SendResult]:
        """Send messages as few frames as possible: per topic one queue (hash of routing_key, or
        the selector), frames of at most ~15 MiB. Results come back in the order given."""
        if not messages:
            return []
        if any(m.delay_level is not None or m.deliver_at is not None for m in messages):
            raise InvalidMessageError("delayed messages are sent one by one, not in send_batch")
        by_topic: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            by_topic.setdefault(m.topic, []).append(i)
        pinned = routing_key is not None
        chosen: dict[str, Any] = {}  # a topic's queue, chosen (and counted) once per call
        if len(by_topic) == 1:  # the usual call: one topic, and (under MAX_FRAME_BODY) one frame
            topic = messages[0].topic
            route = await self.route(topic)
            queue = chosen[topic] = self._queue_for_sending(route, routing_key, len(messages))
            parts: list[bytes] = []
            if append_records(parts, messages, queue if isinstance(queue, int) else queue.queue_id) <= MAX_FRAME_BODY:
                return (await self._send_frame(topic, queue, b"".join(parts), {}, pinned)).results()
        results: list[SendResult | None] = [None] * len(messages)
        for topic, idxs in by_topic.items():
            route = await self.route(topic)
            queue = chosen[topic] if topic in chosen else self._queue_for_sending(route, routing_key, len(idxs))
            queue_id = queue if isinstance(queue, int) else queue.queue_id
            chunk: list[bytes] = []
            chunk_idx: list[int] = []
            size = 0
            for i in idxs:
                rec: list[bytes] = []
                n = append_records(rec, (messages[i],), queue_id)
                if chunk and size + n > MAX_FRAME_BODY:
                    answer = await self._send_frame(topic, queue, b"".join(chunk), {}, pinned)
                    for j, r in zip(chunk_idx, answer.results(), strict=True):
                        results[j] = r
                    chunk, chunk_idx, size = [], [], 0
                chunk += rec
                chunk_idx.append(i)
                size += n
            answer = await self._send_frame(topic, queue, b"".join(chunk), {}, pinned)
            for j, r in zip(chunk_idx, answer.results(), strict=True):
                results[j] = r
        return results  # type: ignore[return-value]

    # ---------------------------------------------------------------- the thread lane

    async def open_thread_lane(self) -> bool:
        """Open the lane (see __init__) when the transport's connection can write from a
        caller's thread (`thread_writable`: tcp without TLS); False, and nothing opened, otherwise (or when the
        connection fails: the main path goes on without a lane). A producer that never calls
        send_async never opens it: it is one more connection to the broker."""
        state = self._lane
        if self._router is not None or self._conn is None or state is None or state.conn is not None \
                or self._closed:
            return False
        lane = BrokerConnection(self.broker, **self._credentials)
        try:
            await lane.connect()
        except TransportError as e:
            log.warning("no send_async lane to %s: %s", self.broker, e)
            return False
        if not getattr(lane._conn, "thread_writable", False) or self._closed:
            await lane.close()
            return False
        with self._lock:
            state.conn = lane
        return True

    def _on_lane(self, key: tuple[str, Any, bool]) -> bool:
        """Whether `key` has frames on the thread lane (read without the lock on the loop thread:
        only callers add keys, and only while nothing of the producer is gathering or in flight on
        the main connection)."""
        lane = self._lane
        return lane is not None and key in lane.keys

    def _send_on_lane(self, key: tuple[str, Any, bool], batch: _OpenBatch, topic: str) -> SendFuture:
        """From a caller's thread (_enqueue chose the lane: every unanswered message of the
        producer is on it, fewer than LANE_DEPTH, so nothing is in flight on the main connection
        or gathering): write the message's frame now. A producer under load soon has a batch
        gathering and batches as before; a sparse one (a message every few hundred µs) sends
        nearly every message this way. A write the transport refuses goes the loop path."""
        state = self._lane
        assert state is not None
        lane = state.conn
        queue = batch.queue
        body = b"".join(batch.parts)
        header, header_b = _cached_send_header(state.headers, topic, queue)
        if lane._credentials is not None:  # signed per request: a fresh timestamp and nonce
            header_b = encode_header(lane._signed(_SEND, header, body))
        loop = self._loop
        assert loop is not None
        state.last = _monotonic()  # (a float store: read under _lock by the sparse rule, any staleness harmless)
        try:
            written = lane._conn.write_from_thread(loop, _SEND, header_b, body, self.send_timeout,
                                                   functools.partial(self._lane_done, key, batch))
        except EQueueError as e:  # FrameTooLargeError: nothing written, the loop path says so too
            log.debug("lane refused a frame: %s", e)
            written = False
        if not written:
            loop.call_soon_threadsafe(self._lane_done, key, batch, None)
        return SendFuture(batch, 0)

    def _lane_done(self, key: tuple[str, Any, bool], batch: _OpenBatch, fut: Any) -> None:
        """On the loop thread: the lane's frame was answered, failed, or (fut None) never
        written. An answer or a broker's error settles the message; a transport failure sends it
        again on the main connection, with the loop path's retries (at least once). Then what
        gathered behind it leaves, in order."""
        state = self._lane
        assert state is not None
        retry = True
        if fut is not None:
            state.frames += 1
            answer, err = _settled(key[0], batch.queue, fut)
            if err is None or not isinstance(err, TransportError):
                retry = False
                batch.parts = ()
                self._release(1)
                batch.resolve(answer, err)
        if retry:
            self._dispatch(key, batch)
        with self._lock:
            state.out -= 1
            left = state.keys[key] - 1
            if left:
                state.keys[key] = left
                behind = ()
            else:
                del state.keys[key]
                behind = self._sealed.pop(key, ())
        if left:
            return
        for b in behind:
            self._dispatch(key, b)
        if key in self._open and key not in self._in_flight:
            self._send_open(key)
        idle = state.idle
        if idle is not None and not idle.done() and not state.out:
            idle.set_result(None)

    def _someone_waits(self) -> None:
        """(the waiting thread) Someone started waiting on a batch that is not answered yet
        (_OpenBatch.future) while max_batches_in_flight frames are out: every gathering batch
        leaves now, past that limit, as flush() sends them. A waiting caller sends nothing more
        meanwhile, so what gathers would only wait its turn behind the frames out, one answer at
        a time: 2000 send_async over 100 topics behind answers that take 5 ms were all answered
        in 173 ms, now in 50 (a /tmp probe through tests/helpers/proxy.py). Below the limit
        nothing is held back but by its own queue's frame in flight (at most `linger`), and many
        callers each waiting on their own message still share frames then. Reads without the
        lock (a batch opened or a frame answered meanwhile only makes this a no-op or late)."""
        loop = self._loop
        if loop is not None and self._router is None and self._frames >= self.max_batches_in_flight \
                and (self._open or self._sealed):
            try:
                loop.call_soon_threadsafe(self._send_gathered)
            except RuntimeError:  # the loop is closed: close() sent everything already
                pass

    def _send_gathered(self) -> None:
        """On the loop thread: send every open and sealed batch now (a key's sealed ones first),
        except those of keys with frames on the thread lane (they leave after them, _lane_done)."""
        lane = self._lane
        # Taken out in place, never replaced: callers on other threads hold these dicts (read
        # before they take the lock), and a batch added to a dict nobody sends would be lost. A
        # key with frames on the lane (put there by another thread, even after flush() waited for
        # the lane) stays: its batches leave after those frames (_lane_done), never before them.
        on_lane = lane.keys if lane is not None else {}

        def take(batches: dict) -> dict:
            taken = {k: b for k, b in batches.items() if k not in on_lane}
            for k in taken:
                del batches[k]
            return taken

        with self._lock:
            open_batches, sealed = take(self._open), take(self._sealed)
        for key, batches in sealed.items():  # before the open batch of their key
            for batch in batches:
                self._dispatch(key, batch)
        if self._router is None and self._sending.multi:
            self._dispatch_frames(send_multi.pack(list(open_batches.items()), self.max_batch_bytes))
        else:
            for key, batch in open_batches.items():
                self._dispatch(key, batch)

    async def flush(self) -> None:
        """Send every open batch now and wait for all in-flight sends."""
        lane = self._lane
        for _ in range(1000):  # the frames on the lane first (what gathered behind them follows)
            if lane is None or not lane.out:
                break
            assert self._loop is not None
            idle = lane.idle
            if idle is None or idle.done():  # flushes at once (from several threads) share one
                idle = lane.idle = self._loop.create_future()
            if lane.out:
                await asyncio.wait_for(asyncio.shield(idle), self.send_timeout * (self.retries + 2))
        self._send_gathered()
        sending = self._sending
        while sending.tasks or sending.now:  # each settles within its timeout (then retries are tasks)
            if sending.tasks:
                await asyncio.gather(*list(sending.tasks), return_exceptions=True)
            else:
                if sending.idle is None or sending.idle.done():
                    assert self._loop is not None
                    sending.idle = self._loop.create_future()
                await sending.idle

    async def close(self) -> None:
        if self._closed:
            return
        await self.flush()
        self._closed = True
        lane = self._lane
        if lane is not None and lane.opening is not None:
            await asyncio.gather(lane.opening, return_exceptions=True)
        if lane is not None and lane.conn is not None:
            await lane.conn.close()
        if self._conn is not None:
            await self._conn.close()
        if self._router is not None:
            await self._router.close()

    async def __aenter__(self) -> AsyncProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Producer:
    """The blocking producer. `Producer(broker="127.0.0.1:10911")`, `start()`, `send(message,
    routing_key=None)`, `send_async`, `send_batch(messages)`, `close()`; a context manager."""

    def __init__(self, broker: str = "127.0.0.1:10911", **options: Any) -> None:
        """`Producer(broker="host:port")` talks to one broker; `Producer(nameserver="host:port,...")`
        routes over every broker of a cluster (docs/cluster.md)."""
        self._async = AsyncProducer(broker, **options)
        self._started = False
        self._direct: DirectConnection | None = None
        # the SEND header of each (topic, queue id) a direct send used, as a map and encoded
        # (the loop path's cache, shared)
        self._send_headers = self._async._sending.headers

    def start(self) -> Producer:
        if not self._started:
            background_loop()
            run_sync(self._async.start())
            if self._async._conn is not None:  # one broker (with nameserver= sends go through the loop)
                self._direct = DirectConnection.of(self._async._conn)
                if self._direct is not None:  # tcp, tls: see open_thread_lane
                    self._async._lane = _ThreadLane(self._send_headers)
            self._started = True
        return self

    @property
    def multi_frames(self) -> int:
        """SEND_MULTI frames sent (docs/client.md, "Many topics in one frame")."""
        return self._async.multi_frames

    @property
    def lane_frames(self) -> int:
        """send_async frames the thread lane carried (docs/client.md, "The thread lane")."""
        lane = self._async._lane
        return 0 if lane is None else lane.frames

    def _route(self, topic: str) -> _Route:
        r = self._async._routes.get(topic)
        if r is None or time.monotonic() - r.fetched > self._async.route_ttl:
            r = run_sync(self._async.route(topic))
        return r

    def send_async(self, message: Message, routing_key: str | None = None,
                   linger: bool = True) -> SendFuture | concurrent.futures.Future:
        """Queue a message for the next batch; the future gives its SendResult."""
        if not self._started:
            self._check()
        a = self._async
        if message.delay_level is not None or message.deliver_at is not None:
            return asyncio.run_coroutine_threadsafe(a.send(message, routing_key), background_loop())
        if routing_key is None and a._router is None:
            joined = a._join_open(message)
            if joined is not None:
                return joined
        route = a._routes.get(message.topic)
        if route is None or time.monotonic() - route.fetched > a.route_ttl:
            route = self._route(message.topic)
        return a._enqueue(route, message, routing_key, linger)

    def send(self, message: Message, routing_key: str | None = None, timeout: float | None = None) -> SendResult:
        """Send one message and wait for its result (no linger: it leaves at once).

        On a transport with blocking connections (tcp, tls) the request is written and awaited in
        the calling thread itself (client/direct.py): no hop through the loop thread, and a caller
        that keeps its thread busy between sends does not stall it. The loop path is used instead
        while earlier `send_async` messages are still unacknowledged (so a message never overtakes
        them), while another thread is using the direct connection, and for delayed messages.

        The default wait covers every retry (a hung broker takes send_timeout per try); past it
        RequestTimeoutError, and the message may still be stored (at least once)."""
        self._check()
        if self._direct is not None and message.delay_level is None and message.deliver_at is None:
            result = self._send_direct(self._direct, message, routing_key, timeout)
            if result is not None:
                return result
        limit = timeout or self._async.send_timeout * (self._async.retries + 2)
        try:
            return self.send_async(message, routing_key, linger=False).result(limit)
        except concurrent.futures.TimeoutError:
            raise RequestTimeoutError(f"send to {message.topic} not answered within {limit:g}s; "
                                      "it may still be stored") from None

    def _send_direct(self, direct: DirectConnection, message: Message, routing_key: str | None,
                     timeout: float | None) -> SendResult | None:
        """`send` over the direct connection; None: use the loop path (see send). The hot path of a
        caller that sends one by one: no asyncio, no Frame or route objects beyond the request."""
        a = self._async
        if a._pending:  # read without the lock: a stale non-zero only costs the loop path
            return None
        topic = message.topic
        queue_id = self._direct_queue(topic, routing_key)
        body = message.body
        if type(body) is bytes and not message.keys and not message.properties:
            # the whole record in one call (the compiled encode_record when built; same bytes as
            # append_record, tests/test_producer_encoding.py)
            rec = record.encode_record(topic, body, message.tag, (), None, queue_id)
        else:
            rec = message.encode(queue_id)
        h = self._request_direct(direct, topic, queue_id, rec, timeout)
        if h is None:
            return None
        if _native_send_results is not None:  # SendResult is frozen: its Python __init__ is 4x the cost
            return _native_send_results(h["id_prefix"], h["positions"][:1], topic, queue_id, h["first_offset"], "")[0]
        return SendResult(f"{h['id_prefix']}{h['positions'][0]:016X}", topic, queue_id, h["first_offset"])

    def _send_batch_direct(self, direct: DirectConnection, messages: Sequence[Message],
                           routing_key: str | None) -> list[SendResult] | None:
        """`send_batch` of one topic, in one frame, over the direct connection (the same request
        the loop path makes, without the two thread hops); None: use the loop path (another
        thread holds the connection, send_async messages are unacknowledged, several topics,
        a delayed message, over MAX_FRAME_BODY)."""
        a = self._async
        if a._pending:
            return None
        topic = messages[0].topic
        for m in messages:
            if m.topic != topic or m.delay_level is not None or m.deliver_at is not None:
                return None
        queue_id = self._direct_queue(topic, routing_key, len(messages))
        parts: list[bytes] = []
        if append_records(parts, messages, queue_id) > MAX_FRAME_BODY:
            return None
        h = self._request_direct(direct, topic, queue_id, b"".join(parts), None)
        if h is None:
            return None
        return _BatchAnswer(topic, queue_id, h["id_prefix"], h["first_offset"], h["positions"]).results()

    def _direct_queue(self, topic: str, routing_key: str | None, count: int | None = None) -> int:
        """The queue id a direct send goes to (one broker). A `send` (count None): the selector's
        message by message, as the loop path's, which round robin keeps even by itself and which
        costs the one-by-one hot path no lock. A `send_batch` of `count` messages: as the loop
        path's `send_batch` chooses (AsyncProducer._queue_for_sending); if the direct connection
        then turns out busy, the loop path chooses and counts the batch again (rare, and it
        only skews the spread by that batch)."""
        a = self._async
        route = a._routes.get(topic)
        if route is None or time.monotonic() - route.fetched > a.route_ttl:
            route = self._route(topic)
        if count is None:
            return a._select(route, routing_key)
        return a._queue_for_sending(route, routing_key, count)

    def _request_direct(self, direct: DirectConnection, topic: str, queue_id: int, body: bytes,
                        timeout: float | None) -> dict[str, Any] | None:
        """One SEND over the direct connection, retried like the loop path's (`retries` times on a
        transport failure, the last failure's type kept: RequestTimeoutError, ConnectionLostError,
        ...; a timed-out send may have been stored, so at least once). The answer's header, or
        None if the direct connection is busy or closed."""
        a = self._async
        header, header_b = _cached_send_header(self._send_headers, topic, queue_id)
        attempt = 0
        while True:
            try:
                resp = direct.try_request_encoded(_SEND, header, header_b, body, timeout or a.send_timeout, spin=True)
                return None if resp is None else resp.header
            except TransportError as e:
                attempt += 1
                if attempt > a.retries:
                    raise type(e)(f"send to {topic}/{queue_id} failed after {attempt} tries: {e}", **e.details) from e
                time.sleep(0.1 * attempt)

    def send_oneway(self, message: Message, routing_key: str | None = None) -> None:
        """Send without waiting for (or reporting) the result."""
        self.send_async(message, routing_key)

    def send_batch(self, messages: Sequence[Message], routing_key: str | None = None) -> list[SendResult]:
        """Send messages as few frames as possible and wait for their results (in the order
        given); see AsyncProducer.send_batch. Like `send`, a batch of one topic goes over the
        direct connection in the calling thread when there is one and nothing else is in flight."""
        self._check()
        if self._direct is not None and messages:
            results = self._send_batch_direct(self._direct, messages, routing_key)
            if results is not None:
                return results
        return run_sync(self._async.send_batch(messages, routing_key))

    def flush(self) -> None:
        if self._started:
            run_sync(self._async.flush())

    def close(self) -> None:
        if self._started:
            if self._direct is not None:
                self._direct.close()
            run_sync(self._async.close())
            self._started = False

    def _check(self) -> None:
        if not self._started:
            raise ClientClosedError("call Producer.start() first (or use it as a context manager)")

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AsyncProducer", "Producer", "record"]
