"""LitePullConsumer: `poll(timeout)` pulls messages in the caller's own thread and returns them.

Why: the push Consumer pulls on the client's asyncio loop thread and hands each message to a
handler thread, two thread hops that cost 0.3-0.4 ms of end-to-end latency and need the loop
thread to get the GIL. Here the caller's thread does it all on one blocking connection of the
transport (contracts.PipelinedBlockingConnection; tcp and tls): every assigned queue has one held
pull in flight on that socket (the broker answers it as soon as its queue gets data, or with
nothing when `hold_ms` ends), except that at most `max_backlog_queues` queues with a backlog have
one at a time, the others waiting their turn (the pulls of queues with a turn go out together, in
PULL_MULTI frames the broker answers at once: broker/multi_pull.py; while they catch up, the held
pulls of queues that caught up go out in the same writes); `poll` waits in `recv` (which releases the GIL) for whichever answer
comes first and returns the decoded messages (at most `max_poll_records` of them: the rest of a
larger answer comes with the next polls); that queue's next pull goes out at once when the
broker has more behind the answer, else when the caller comes back to poll. No handler
runs anywhere: the caller handles what poll returned in its own thread.

Guarantees:
- Per-queue order: one pull per queue in flight, so a queue's messages come back in offset order
  (across queues there is no order). `seek` moves a queue; the answer of the pull it replaced is
  dropped unread, and so is what poll had not returned yet of an earlier answer.
- At least once: the offset committed for a queue never passes a message poll has not returned,
  and a message counts as consumed only once the caller calls poll again (it came back for more)
  or calls commit(). Auto-commit (every `auto_commit_interval` seconds, at the start of a poll,
  without waiting for the answer) sends the consumed offsets; commit() sends everything poll
  returned so far and waits for the broker; close() commits the consumed offsets (not the last
  poll's messages: call commit() first if they were handled). A queue another member takes over
  starts at the committed offset, so it may see messages again, never miss one.
- Group membership (`subscribe`) is the push consumer's own code (heartbeat, allocation strategy,
  rebalance on a group change): an AsyncConsumer that keeps only the assignment, on the client's
  background loop thread, which never runs user code. poll picks an assignment change up at its
  next call. `assign` takes queues by hand and joins no group.
- Threads: one thread polls (a second concurrent poll is refused); close() may be called from any
  thread and ends a waiting poll, which then returns [].
- Errors are typed: TopicNotFoundError / QueueNotFoundError at assign or subscribe, TransportError
  subclasses when the broker cannot be reached (the next poll connects again and re-issues the
  pulls), ConfigError for a transport without blocking connections (zmq: use Consumer) or for
  mixing assign and subscribe, ClientClosedError after close().
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from equeue_core.client.backlog_gate import DEFAULT_MAX_BACKLOG_BYTES, RecordBytes, turns_within
from equeue_core.client.connection import BrokerConnection, raise_for_error, signed_header
from equeue_core.client.consumer import (
    AsyncConsumer,
    checked_backlog_bytes,
    checked_backlog_queues,
    checked_count,
    parse_expression,
)
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.client.message import ReceivedMessage, decode_batch
from equeue_core.client.process_queue import ProcessQueue
from equeue_core.client.pull_batch import PULL_BATCH_CEILING, PULL_BATCH_FLOOR, AdaptivePullBatch
from equeue_core.client.pull_multi import answer_parts
from equeue_core.client.pulled_batch import DECODE_AT_MOST, DECODE_CHUNK, PulledBatch
from equeue_core.codes import MAX_PULL_SECTIONS, Code, PullStatus
from equeue_core.contracts import PipelinedBlockingConnection
from equeue_core.errors import (
    ClientClosedError,
    ConfigError,
    EQueueError,
    QueueNotFoundError,
    RequestTimeoutError,
    TransportError,
)
from equeue_core.frame import FLAG_ERROR, Frame
from equeue_core.plugins import get_plugin_manager

log = logging.getLogger("equeue.lite_pull")

QueueKey = tuple[str, int]
REQUEST_TIMEOUT = 30.0  # seconds for the requests poll does not hold (routes, offsets, commits)
IDLE_WAIT = 0.05  # seconds a poll with no queue assigned sleeps between looks at the assignment
_PENDING = -1  # a queue's pull_id while its pull waits to be written (in _pending or _held)


class _Queue:
    """One assigned queue: where its next pull starts and how far the caller got."""

    __slots__ = ("topic", "queue_id", "next_offset", "returned", "consumed", "committed", "pull_id",
                 "batch", "header", "tags", "behind", "turn", "waiting", "paused")

    def __init__(self, topic: str, queue_id: int, offset: int, batch: AdaptivePullBatch,
                 header: dict[str, Any], tags: frozenset[str] | None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.next_offset = offset  # where the next pull starts
        self.returned = offset  # after the last message poll returned (or skipped by the tag filter)
        self.consumed = offset  # after the last message the caller came back from
        self.committed = offset  # as the broker has it (as far as this consumer knows)
        self.pull_id: int | None = None  # request id of the pull in flight (_PENDING: not written yet)
        self.batch = batch
        self.header = header
        self.tags = tags
        self.behind = False  # the broker said more is stored past next_offset (a backlog)
        self.turn = False  # its pull in flight holds one of max_backlog_queues turns
        self.waiting = False  # in _waiting: behind, for a turn before its next pull
        self.paused = False  # pause(): no pull is sent until resume()


class _Rest:
    """The part of one pull answer that poll() has not returned yet (max_poll_records): its
    records stay bytes until a poll decodes them."""

    __slots__ = ("queue", "batch", "index", "end_offset")

    def __init__(self, queue: _Queue, batch: PulledBatch, end_offset: int) -> None:
        self.queue = queue
        self.batch = batch
        self.index = 0  # the first record not returned
        self.end_offset = end_offset  # the answer's next_offset: past its last record

    def first_offset(self) -> int:
        """The queue offset of the first record not returned."""
        return self.batch.offset_at(self.index) if self.index < len(self.batch) else self.end_offset


class _Membership(AsyncConsumer):
    """The push consumer's group membership without its pulls: heartbeat, rebalance and the
    allocation strategy decide `queues`; each change is published to the LitePullConsumer
    (assignment(), thread-safe). Pulling and committing are the LitePullConsumer's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._published: tuple[int, dict[QueueKey, tuple[int, int]]] = (0, {})
        self._ends: dict[QueueKey, int] = {}  # each queue's end offset when it was taken

    def _all_topics(self) -> dict[str, str]:
        return dict(self.subscriptions)  # nothing is sent back, so no retry topic

    def _add_queue(self, key: QueueKey, offset: int, end: int) -> None:
        self.queues[key] = ProcessQueue(key[0], key[1], offset)  # no pull loop: poll pulls
        self._ends[key] = end

    async def _apply(self, wanted: set[QueueKey]) -> None:
        await super()._apply(wanted)
        version, _ = self._published
        ends = self._ends
        for key in [k for k in ends if k not in self.queues]:
            del ends[key]
        self._published = (version + 1, {k: (pq.next_offset, ends.get(k, pq.next_offset))
                                         for k, pq in self.queues.items()})

    async def commit(self) -> None:
        """The LitePullConsumer commits in the polling thread."""

    def assignment(self) -> tuple[int, dict[QueueKey, tuple[int, int]]]:
        """(version, {queue: (start offset, end offset then)}) as of the last rebalance."""
        return self._published

    async def connect_only(self) -> None:
        """Assign mode: the connection for start offsets, without joining the group."""
        self._conn = await BrokerConnection(self.broker, **self._credentials).connect()
        self._running = True

    async def start_points(self, keys: list[QueueKey]) -> list[tuple[int, int]]:
        """Where each queue starts (the group's committed offset, else consume_from) and its
        end offset, asked in one request."""
        return await self._start_points(keys)

    async def disconnect(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    @property
    def id_prefix(self) -> str:
        return self._id_prefix


# Consumer options a LitePullConsumer refuses by name (instead of "unknown credential argument")
PUSH_CONSUMER_ONLY = ("nameserver", "mode", "orderly", "consume_batch_size", "threads", "threads_min",
                      "max_reconsume_times", "consume_timeout", "commit_interval", "lock_interval",
                      "offset_dir", "flow_max_messages", "flow_max_bytes", "flow_max_span",
                      "parallel_per_queue")
DEFAULT_BACKLOG_QUEUES = 16
# A queue with a turn holds one pull answer (in flight, or read and not yet returned); while the
# pulls of one half of the turns are answered the caller goes through the other half's
# (_flush_pulls), so never fewer than two turns
LEAST_TURNS = 2
# At most this many messages a poll() returns (Kafka's max.poll.records): the rest of a larger
# answer stays bytes until the polls after it. A whole answer of 1024 decoded at once cost a
# caller who drops each poll's list ~40 % of its drain in collections (DECODE_AT_MOST).
DEFAULT_MAX_POLL_RECORDS = DECODE_AT_MOST


async def _no_handler(*_: object) -> None:  # the membership never pulls, so never calls it
    raise AssertionError("a LitePullConsumer's membership handles no messages")


class LitePullConsumer:
    """`LitePullConsumer(group, broker="h:p")`, then `subscribe(topic)` (group membership) or
    `assign(topic, queue_ids)`, then `poll(timeout)` in a loop; see the module docstring."""

    def __init__(self, group: str, broker: str = "127.0.0.1:10911", *, consume_from: str | int = "last",
                 allocation: str = "averagely", pull_batch: int | None = None, hold_ms: int = 15000,
                 auto_commit: bool = True, auto_commit_interval: float = 5.0,
                 heartbeat_interval: float = 10.0, rebalance_interval: float = 20.0,
                 client_id: str | None = None, request_timeout: float = REQUEST_TIMEOUT,
                 max_backlog_queues: int = DEFAULT_BACKLOG_QUEUES,
                 max_backlog_bytes: int | None = DEFAULT_MAX_BACKLOG_BYTES,
                 max_poll_records: int = DEFAULT_MAX_POLL_RECORDS, **credentials: str | None) -> None:
        """`pull_batch`: messages per pull of a queue (None: adaptive 32..1024, grows on a
        backlog); `hold_ms`: how long the broker holds a pull that found nothing;
        `request_timeout`: seconds a request may go unanswered, and a held pull beyond its
        hold_ms, before the connection counts as dead (RequestTimeoutError; the next poll connects
        again); `max_backlog_queues`: at most this many queues with a backlog have a pull in
        flight at once, the others waiting their turn in order (queues caught up always keep
        theirs, held at the broker), so catching up on 1000 queues has the broker build that many
        answers at a time, not its whole per-connection budget (docs/client.md);
        `max_backlog_bytes` (None: no bound by bytes): fewer turns when that many queues' answers
        would not fit in it, a queue's answer counted as its pull batch's ceiling of messages of
        the size measured so far, but at least two (client/backlog_gate.py);
        `max_poll_records`: at most this many messages a poll returns (a larger answer's rest
        comes with the next polls, before anything else of its queue); credentials as
        for Consumer (access_key, secret_key, tls_*). ConfigError for a transport without
        blocking connections."""
        unsupported = sorted(set(credentials) & set(PUSH_CONSUMER_ONLY))
        if unsupported:
            raise ConfigError(f"LitePullConsumer does not take {', '.join(unsupported)} (Consumer "
                              "options): it reads one broker in clustering mode and the caller "
                              "handles what poll returns; use Consumer for a name server, "
                              "broadcasting, orderly handling or retry topics")
        self.group = group
        self.max_backlog_queues = checked_backlog_queues(max_backlog_queues)
        self.max_backlog_bytes = checked_backlog_bytes(max_backlog_bytes)
        self._record_bytes = RecordBytes()  # a record's wire bytes, from the answers (_turn_limit)
        self.max_poll_records = checked_count("max_poll_records", max_poll_records)
        self.pull_batch = pull_batch
        self.hold_ms = max(1, int(hold_ms))
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.request_timeout = request_timeout
        link = BrokerConnection(broker, **credentials)  # not connected: address, settings, signer
        connect_blocking = getattr(get_plugin_manager().transport(link.address.transport),
                                   "connect_blocking", None)
        if connect_blocking is None:
            raise ConfigError(f"transport {link.address.transport!r} has no blocking connections; "
                              "LitePullConsumer needs tcp or tls (use Consumer)")
        self._conn: PipelinedBlockingConnection = connect_blocking(link.address.host, link.address.port,
                                                                   link.settings)
        self._signer = link._credentials
        background_loop()
        self._members = _Membership(group, broker, consume_from=consume_from, allocation=allocation,
                                    heartbeat_interval=heartbeat_interval,
                                    rebalance_interval=rebalance_interval, client_id=client_id,
                                    **credentials)
        self._mode: str | None = None  # "assign" or "subscribe"
        # _follow: which of a shared membership's queues are this consumer's (None: all of them)
        self._part: Callable[[QueueKey], bool] | None = None
        self._owns_members = True  # False after _follow: close() leaves the group to its owner
        self._members_connected = False
        self._version = 0  # of the membership's assignment applied here
        self._filters: dict[str, tuple[frozenset[str] | None, list[int] | None]] = {}
        self._queues: dict[QueueKey, _Queue] = {}
        # request id -> queue of a PULL in flight, or the queues of a PULL_MULTI in its order
        self._pulls: dict[int, QueueKey | list[QueueKey]] = {}
        # queues with a turn whose pull waits to go out with others in one PULL_MULTI (_flush_pulls)
        self._pending: list[_Queue] = []
        # caught-up queues whose held PULL waits to be written with the next PULL_MULTI, while
        # other queues catch up (a transport that writes several frames at once: write_many)
        self._held: list[_Queue] = []
        self._write_many = getattr(self._conn, "write_many", None)
        self._multi = True  # False once the broker answered PULL_MULTI with unknown_request
        self._commits: dict[int, list[tuple[_Queue, int]]] = {}  # auto-commits not answered yet
        self._ready: deque[tuple[QueueKey, Frame]] = deque()  # pull answers read, not yet taken
        self._turns = 0  # pulls in flight of queues with a backlog (at most max_backlog_queues)
        # What the next poll has to do, kept as it happens so a poll costs the same with 4 queues
        # as with 1000: the queues whose `returned` moved (consumed catches up), and the queues
        # with no pull in flight that poll sends one for (new, caught up, re-seeked, reconnected)
        self._advanced: list[_Queue] = []
        self._idle: list[_Queue] = []
        self._waiting: deque[_Queue] = deque()  # queues with a backlog waiting for a turn, in order
        self._rest: _Rest | None = None  # the part of an answer poll has not returned yet
        self.stats = {"backlog_queues_peak": 0, "pulls": 0, "multi_pulls": 0}
        self._id_prefix: str | None = None
        self._next_commit = time.monotonic() + auto_commit_interval
        self._heard = time.monotonic()  # when a frame last arrived (or the pulls were first sent)
        self._polling = threading.Lock()
        self._closed = False
        self.last_queue: QueueKey | None = None  # the queue the last poll's messages came from

    @property
    def client_id(self) -> str:
        return self._members.client_id

    def assignment(self) -> list[QueueKey]:
        """The queues this consumer pulls (after subscribe: as of the group's last rebalance;
        poll takes a change up at its next call)."""
        if self._mode == "subscribe":
            return sorted(self._members.assignment()[1])
        return sorted(self._queues)

    # ---------------------------------------------------------------- setup

    def assign(self, topic: str, queue_ids: list[int] | None = None, expression: str = "*") -> LitePullConsumer:
        """Pull these queues of `topic` (all of them if None), starting at the group's committed
        offset (else at consume_from). No group membership: no other member shares them."""
        self._check_open()
        if self._mode == "subscribe":
            raise ConfigError("a LitePullConsumer either subscribes or assigns queues, not both")
        self._mode = "assign"
        n = self._call(Code.ROUTE, {"topic": topic}).header["queues"]  # TopicNotFoundError
        wanted = list(range(n)) if queue_ids is None else list(queue_ids)
        for q in wanted:
            if not isinstance(q, int) or isinstance(q, bool) or not 0 <= q < n:
                raise QueueNotFoundError(f"topic {topic!r} has queues 0..{n - 1}, not {q!r}",
                                         topic=topic, queue_id=q)
        self._filters[topic] = parse_expression(expression)
        self._connect_members()
        new = [(topic, q) for q in dict.fromkeys(wanted) if (topic, q) not in self._queues]
        if new:
            for key, (offset, end) in zip(new, run_sync(self._members.start_points(new)), strict=True):
                self._add(key, offset, end)
        return self

    def subscribe(self, topic: str, expression: str = "*") -> LitePullConsumer:
        """Join the group for `topic`: its queues are spread over the group's members (the
        allocation strategy) and move when members come and go."""
        self._check_open()
        if self._mode == "assign":
            raise ConfigError("a LitePullConsumer either subscribes or assigns queues, not both")
        self._call(Code.ROUTE, {"topic": topic})  # TopicNotFoundError now, not a silent nothing
        self._filters[topic] = parse_expression(expression)
        self._members.subscribe(topic, expression)
        if self._mode is None:
            self._mode = "subscribe"
            run_sync(self._members.start(_no_handler))
            self._members_connected = True
        else:
            run_sync(self._members.rebalance())
        self._sync_assignment()
        return self

    def _connect_members(self) -> None:
        """Assign mode uses the membership's connection only for start offsets."""
        if not self._members_connected:
            run_sync(self._members.connect_only())
            self._members_connected = True

    def _add(self, key: QueueKey, offset: int, end: int) -> None:
        """Take a queue at `offset`. With a backlog (its end was past `offset` when asked), its
        first pull asks for all of it (within the adaptive batch's bounds) and takes a turn."""
        topic, q = key
        tags, hashes = self._filters.get(topic, (None, None))
        if self.pull_batch is not None:
            batch = AdaptivePullBatch(self.pull_batch, self.pull_batch)
        else:
            batch = AdaptivePullBatch(PULL_BATCH_FLOOR, PULL_BATCH_CEILING)
            batch.expect(end - offset)
        header: dict[str, Any] = {"group": self.group, "topic": topic, "queue_id": q, "offset": offset,
                                  "max_count": batch.size, "hold_ms": self.hold_ms}
        if hashes:
            header["tags"] = hashes
        queue = self._queues[key] = _Queue(topic, q, offset, batch, header, tags)
        queue.behind = end > offset
        self._idle.append(queue)

    def _remove(self, key: QueueKey) -> None:
        """Stop pulling a queue: its pull's answer is dropped, its consumed offset committed."""
        queue = self._queues.pop(key)
        self._drop_pull(queue)
        self._drop_rest(queue)
        if queue.consumed != queue.committed:
            self._send_commit([queue], wait=False)

    def _sync_assignment(self) -> None:
        """Apply the membership's latest assignment (subscribe mode)."""
        if self._mode != "subscribe":
            return
        version, wanted = self._members.assignment()
        if version == self._version:
            return
        self._version = version
        part = self._part
        if part is not None:
            wanted = {k: v for k, v in wanted.items() if part(k)}
        for key in [k for k in self._queues if k not in wanted]:
            self._remove(key)
        for key, (offset, end) in wanted.items():
            if key not in self._queues:
                self._add(key, offset, end)

    def _follow(self, members: _Membership, part: Callable[[QueueKey], bool]) -> None:
        """Pull the queues of another's group membership that `part` picks, with its topic
        filters: the pulling handler threads of a Consumer (client/pulling_handlers.py) share
        one membership and split its queues. This consumer neither joins nor leaves the group."""
        self._check_open()
        if self._mode is not None:
            raise ConfigError("_follow() comes before subscribe or assign")
        self._members = members
        self._filters = members._filters
        self._part = part
        self._owns_members = False  # nor closes the membership's connection
        self._mode = "subscribe"

    def seek(self, topic: str, queue_id: int, offset: int) -> None:
        """The next messages of this (assigned) queue start at `offset`; a commit then records it."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            raise ConfigError(f"queue {topic}/{queue_id} is not assigned to this consumer")
        self._drop_pull(queue)
        self._drop_rest(queue)
        queue.next_offset = queue.returned = queue.consumed = offset
        queue.behind = False  # not known at the new offset: its first pull says
        self._idle.append(queue)

    def pause(self, topic: str, queue_id: int) -> None:
        """Send no more pulls for this (assigned) queue until resume(); the answer of its pull in
        flight is dropped unread. Its consumed offset stays where it is (auto-commit has nothing
        new to send for it). For a queue the caller cannot go on with, such as a corrupt record."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            raise ConfigError(f"queue {topic}/{queue_id} is not assigned to this consumer")
        self._drop_pull(queue)
        rest = self._drop_rest(queue)
        if rest is not None:  # pulled again from its first message not returned, after resume()
            queue.next_offset = rest.first_offset()
            queue.behind = True
        queue.paused = True

    def resume(self, topic: str, queue_id: int) -> None:
        """Pull a paused queue again (from where it stood, or where a seek moved it)."""
        queue = self._queues.get((topic, queue_id))
        if queue is not None and queue.paused:
            queue.paused = False
            self._idle.append(queue)

    # ---------------------------------------------------------------- polling

    def poll(self, timeout: float = 1.0) -> list[ReceivedMessage]:
        """The next messages of one queue, in offset order, or [] when none arrived within
        `timeout` seconds (or close() was called meanwhile). What the previous poll returned
        counts as consumed from now on (auto-commit may send it)."""
        return self._poll_guarded(timeout, False)  # type: ignore[return-value]

    def _poll_batch(self, timeout: float) -> list[ReceivedMessage] | PulledBatch:
        """poll(), for the pulling handler threads (client/pulling_handlers.py): an answer of more
        than DECODE_CHUNK messages comes back undecoded, as a PulledBatch the caller decodes (and
        tag-filters) a chunk at a time (a smaller one is decoded whole, as poll() does).
        Why: a whole answer decoded at once (up to 1024 messages) is that many objects alive
        together, and the collector ran a young-generation pass or two on every answer while a
        handler went through them (py-spy of a drain: 42 % of the threads' samples on the
        decode's line; docs/benchmarks.md, "... pulling threads decode a chunk at a time")."""
        return self._poll_guarded(timeout, True)

    def _poll_guarded(self, timeout: float, raw: bool) -> list[ReceivedMessage] | PulledBatch:
        self._check_open()
        if not self._polling.acquire(blocking=False):
            raise ConfigError("poll() is already running in another thread; one thread polls")
        try:
            return self._poll(timeout, raw)
        except TransportError:
            if self._closed:
                return []
            self._lost()
            raise
        finally:
            self._polling.release()

    def _poll(self, timeout: float, raw: bool = False) -> list[ReceivedMessage] | PulledBatch:
        msgs = self._poll_answers(timeout, raw)
        self._flush_pulls(False)
        return msgs

    def _poll_answers(self, timeout: float, raw: bool) -> list[ReceivedMessage] | PulledBatch:
        deadline = time.monotonic() + timeout
        self._mark_consumed()
        self._sync_assignment()
        if self.auto_commit and time.monotonic() >= self._next_commit:
            self._next_commit = time.monotonic() + self.auto_commit_interval
            self._send_commit(list(self._queues.values()), wait=False)
        if self._id_prefix is None:
            self._id_prefix = self._members.id_prefix or _id_prefix(self._call(Code.BROKER_INFO, {}))
        self._pull_idle()
        if self._rest is not None:
            msgs = self._rest_next()
            if msgs:
                return msgs
        while True:
            while self._ready:
                key, frame = self._ready.popleft()
                msgs = self._take(self._queues[key], frame, raw)
                if msgs:
                    self.last_queue = key
                    return msgs
            self._flush_pulls(True)  # nothing in hand: every pull waiting to go out goes now
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                return []
            if not self._pulls:  # no queue assigned (yet): wait for a rebalance to bring one
                time.sleep(min(remaining, IDLE_WAIT))
                self._sync_assignment()
                self._pull_idle()
                continue
            frame = self._conn.read(remaining)
            if frame is None:
                self._check_alive()
                return []
            self._heard = time.monotonic()
            self._route(frame)

    def _mark_consumed(self) -> None:
        """What poll returned counts as consumed: the caller came back (or commits)."""
        for queue in self._advanced:
            queue.consumed = queue.returned
        self._advanced.clear()

    def done(self) -> None:
        """What poll returned so far counts as consumed now, not only at the next poll: the
        caller handled it (auto-commit, commit() and close() send it). In the polling thread."""
        with self._polling:
            self._mark_consumed()

    def _pull_idle(self) -> None:
        """A pull for each queue that has none in flight (and is still assigned)."""
        idle, self._idle = self._idle, []
        queues = self._queues
        for queue in idle:
            if queue.pull_id is None and not queue.paused and queues.get((queue.topic, queue.queue_id)) is queue:
                self._pull(queue)

    def _check_alive(self) -> None:
        """A broker that stopped answering (no FIN: a hung process, a cut network) would leave
        poll returning [] for ever: a held pull unanswered request_timeout s past its hold_ms
        ends the connection instead (RequestTimeoutError; the next poll starts over)."""
        silent = time.monotonic() - self._heard
        if self._pulls and silent > self.hold_ms / 1000 + self.request_timeout:
            self._conn.close()
            raise RequestTimeoutError(f"no answer from the broker for {silent:.1f}s (held pulls "
                                      f"end after {self.hold_ms} ms)", timeout=self.request_timeout)

    def _pull(self, queue: _Queue) -> None:
        """Send the queue's next pull; a queue with a backlog takes a turn first, or waits for one
        (after the queues already waiting)."""
        if queue.behind and not queue.turn:
            if queue.waiting:
                return
            if self._turns >= self._turn_limit():
                queue.waiting = True
                self._waiting.append(queue)
                return
            self._turns += 1
            queue.turn = True
            if self._turns > self.stats["backlog_queues_peak"]:
                self.stats["backlog_queues_peak"] = self._turns
        if queue.turn and self._multi:
            queue.pull_id = _PENDING
            self._pending.append(queue)
            return
        if self._turns and self._multi and self._write_many is not None:
            queue.pull_id = _PENDING  # a catch-up is on: written with its next PULL_MULTI
            self._held.append(queue)
            return
        self._send_pull(queue)

    def _send_pull(self, queue: _Queue) -> None:
        """The queue's pull as a PULL of its own (held at the broker while the queue has nothing)."""
        if not self._pulls:
            self._heard = time.monotonic()  # the silence is counted from the first pull in flight
        queue.pull_id = self._write(Code.PULL, self._pull_header(queue))
        self._pulls[queue.pull_id] = (queue.topic, queue.queue_id)

    def _pull_header(self, queue: _Queue) -> dict[str, Any]:
        header = queue.header
        header["offset"] = queue.next_offset
        header["max_count"] = queue.batch.size
        self.stats["pulls"] += 1
        return header

    def _flush_pulls(self, now: bool) -> None:
        """Write the pulls waiting: those of queues with a turn (`_pending`) together in PULL_MULTI
        frames, and the caught-up queues' held PULLs (`_held`) with them, all in one write. They
        go `now` (poll has nothing else in hand), or once half the turns wait, so that one half's
        answers are read while the caller goes through the other's. Why together: a pull costs
        both ends a frame whatever it brings, and 1000 queues of a few hundred messages each
        cost a pull per queue where 4 queues cost one per 1024 messages (broker/multi_pull.py)."""
        pending, held = self._pending, self._held
        if not (pending or held) or (not now and 2 * len(pending) < self._turns):
            return
        self._pending, self._held = [], []
        if not self._pulls:
            self._heard = time.monotonic()
        frames: list[tuple[int, dict[str, Any]]] = []
        owners: list[_Queue | list[_Queue]] = []
        if len(pending) == 1:  # a lone pull needs no PULL_MULTI: a PULL of its own
            held = pending + held
        else:
            for i in range(0, len(pending), MAX_PULL_SECTIONS):
                part = pending[i:i + MAX_PULL_SECTIONS]
                frames.append((Code.PULL_MULTI, {
                    "group": self.group,
                    "pulls": [[q.topic, q.queue_id, q.next_offset, q.batch.size, q.header.get("tags")]
                              for q in part]}))
                owners.append(part)
                self.stats["pulls"] += len(part)
                self.stats["multi_pulls"] += 1
        for queue in held:
            frames.append((Code.PULL, self._pull_header(queue)))
            owners.append(queue)
        for owner, request_id in zip(owners, self._write_frames(frames), strict=True):
            if type(owner) is list:
                for q in owner:
                    q.pull_id = request_id
                self._pulls[request_id] = [(q.topic, q.queue_id) for q in owner]
            else:
                owner.pull_id = request_id
                self._pulls[request_id] = (owner.topic, owner.queue_id)

    def _route(self, frame: Frame) -> None:
        """A frame read while waiting: a pull's answer goes to `_ready`, an auto-commit's is
        settled, anything else (a dropped pull's answer, a push) is left."""
        key = self._pulls.pop(frame.request_id, None)
        if key is not None:
            if type(key) is list:
                self._split(frame, key)
            else:
                self._ready.append((key, frame))
            return
        committed = self._commits.pop(frame.request_id, None)
        if committed is not None:
            if frame.flags & FLAG_ERROR:
                try:
                    raise_for_error(frame)
                except EQueueError as e:
                    log.warning("auto-commit of group %s failed: %s", self.group, e)
                return
            for queue, offset in committed:
                queue.committed = offset

    def _split(self, frame: Frame, keys: list[QueueKey]) -> None:
        """A PULL_MULTI's answer: each section goes to `_ready` as the answer of its queue's own
        pull would (its records a view of the answer's body), in the request's order; a section
        of a queue that has dropped that pull since (seek, pause, removal) is left. The queues
        past the last result were not read (the answer's byte budget): they pull again. A
        refused request is each queue's error; a broker that does not know PULL_MULTI is sent
        PULLs from now on."""
        rid = frame.request_id
        queues = self._queues
        current = []
        for key in keys:
            queue = queues.get(key)
            current.append(queue if queue is not None and queue.pull_id == rid else None)
        if frame.flags & FLAG_ERROR:
            if frame.header.get("error") == "unknown_request":
                log.info("the broker does not take PULL_MULTI: one PULL a queue from now on")
                self._multi = False
                for queue in current:
                    if queue is not None:
                        queue.pull_id = None
                        self._pull(queue)
                return
            for key, queue in zip(keys, current, strict=True):
                if queue is not None:
                    self._ready.append((key, frame))
            return
        parts = answer_parts(frame)
        for i, (key, queue) in enumerate(zip(keys, current, strict=True)):
            if queue is None:
                continue
            if i < len(parts):
                self._ready.append((key, parts[i]))
            else:  # not read (the answer's byte budget): still has its turn, waits for the next
                queue.pull_id = None
                self._pull(queue)

    def _take(self, queue: _Queue, frame: Frame, raw: bool = False) -> list[ReceivedMessage] | PulledBatch:
        """Handle one pull answer. The queue's next pull goes out now when the broker has more
        behind this answer (it is read while the caller handles these), or when this answer
        brought nothing to return; a queue that is caught up sends it when the caller comes back
        to poll (its messages then wait for no socket write). A queue with a turn keeps it while
        the broker says it is behind (its pulls grow to the batch ceiling); once caught up (or
        on an error) the turn passes to the queue waiting longest."""
        queue.pull_id = None
        if frame.flags & FLAG_ERROR:
            self._end_turn(queue)
            self._idle.append(queue)  # the next poll sends the pull again
            raise_for_error(frame)
        h = frame.header
        if h["status"] == PullStatus.OFFSET_RESET:
            log.warning("offset %d of %s/%d is out of range; moving to %d",
                        queue.next_offset, queue.topic, queue.queue_id, h["next_offset"])
        elif self.pull_batch is None and "max_offset" in h:
            queue.batch.update(h["count"], h["next_offset"], h["max_offset"])
        queue.next_offset = h["next_offset"]
        queue.behind = h.get("max_offset", 0) > queue.next_offset
        if not queue.behind:
            self._end_turn(queue)
        msgs: list[ReceivedMessage] | PulledBatch = []
        queue.returned = queue.next_offset
        count = h.get("count")
        if count:
            self._record_bytes.add(len(frame.body), count)
            if self._waiting:  # the first answers tell the size: the turns may grow
                self._admit(True)
            if raw and count > DECODE_CHUNK:  # stays bytes (_poll_batch), filtered as it is decoded
                msgs = PulledBatch(frame.body, self._id_prefix or "", queue.tags)
            elif not raw and count > self.max_poll_records:  # the first part now, the rest later
                self._rest = _Rest(queue, PulledBatch(frame.body, self._id_prefix or "", queue.tags),
                                   queue.next_offset)
                msgs = self._rest_next()
            else:
                msgs = decode_batch(frame.body, self._id_prefix or "")
                if queue.tags is not None:
                    msgs = [m for m in msgs if m.tag in queue.tags]
        self._advanced.append(queue)
        if not msgs or queue.behind:
            self._pull(queue)
        else:
            self._idle.append(queue)
        return msgs

    def _rest_next(self) -> list[ReceivedMessage]:
        """The next max_poll_records messages of the answer in `_rest` (fewer where the tag filter
        drops some; [] once it is all returned). The queue's `returned` moves to the first message
        not returned (the answer's end after its last part), so consumed and committed offsets
        never pass a message the caller has not had."""
        rest = self._rest
        assert rest is not None
        queue, batch = rest.queue, rest.batch
        n = len(batch)
        msgs: list[ReceivedMessage] = []
        while not msgs and rest.index < n:
            i = rest.index
            j = rest.index = min(n, i + self.max_poll_records)
            msgs = batch.decode_kept(i, j)
        if rest.index < n:
            queue.returned = batch.offset_at(rest.index)
        else:
            queue.returned = rest.end_offset
            self._rest = None
        self._advanced.append(queue)
        if msgs:
            self.last_queue = (queue.topic, queue.queue_id)
        return msgs

    def _drop_rest(self, queue: _Queue) -> _Rest | None:
        """Forget the rest of `queue`'s answer not returned yet (seek, pause, the queue gone);
        returns it, if there was one. The queue's `returned` is already its first offset
        (_rest_next)."""
        rest = self._rest
        if rest is None or rest.queue is not queue:
            return None
        self._rest = None
        return rest

    def _end_turn(self, queue: _Queue, pull_now: bool = True) -> None:
        """The queue's pull is answered or dropped: its turn goes to the queue waiting longest,
        whose pull goes out now (inside poll), or with the next poll (`pull_now` False: seek and
        a rebalance's removal write nothing to the socket)."""
        if not queue.turn:
            return
        queue.turn = False
        self._turns -= 1
        self._admit(pull_now)

    def _turn_limit(self) -> int:
        """How many queues may hold a turn now: max_backlog_queues, or fewer while that many
        answers of the message size measured so far would pass max_backlog_bytes (LEAST_TURNS
        before the first answer with messages)."""
        if self.max_backlog_bytes is None:
            return self.max_backlog_queues
        return turns_within(self.max_backlog_queues, self.max_backlog_bytes,
                            self._record_bytes.window(self.pull_batch or PULL_BATCH_CEILING), LEAST_TURNS)

    def _admit(self, pull_now: bool) -> None:
        """Give free turns to the queues waiting longest; their pulls go out now (inside poll),
        or with the next poll (`pull_now` False)."""
        waiting = self._waiting
        free = self._turn_limit() - self._turns
        while waiting and free > 0:
            nxt = waiting.popleft()
            nxt.waiting = False
            if (self._queues.get((nxt.topic, nxt.queue_id)) is not nxt or nxt.pull_id is not None
                    or nxt.paused):
                continue
            free -= 1
            if pull_now:
                self._pull(nxt)
            else:
                self._idle.append(nxt)

    def _drop_pull(self, queue: _Queue) -> None:
        """Forget the queue's pull: in flight, or answered and not yet taken (its answer is
        dropped unread), and its place in line for a turn."""
        if queue.pull_id == _PENDING:
            (self._pending if queue in self._pending else self._held).remove(queue)
        elif queue.pull_id is not None and type(self._pulls.get(queue.pull_id)) is not list:
            self._pulls.pop(queue.pull_id, None)  # (a PULL_MULTI's answer leaves this queue's part)
        queue.pull_id = None
        key = (queue.topic, queue.queue_id)
        self._ready = deque(item for item in self._ready if item[0] != key)
        if queue.waiting:
            queue.waiting = False
            self._waiting.remove(queue)
        self._end_turn(queue, pull_now=False)

    def _lost(self) -> None:
        """The connection broke: every pull is gone with it; the next poll issues them again."""
        self._pulls.clear()
        self._pending.clear()
        self._held.clear()
        self._commits.clear()
        self._ready.clear()
        self._waiting.clear()
        self._turns = 0
        for queue in self._queues.values():
            queue.pull_id = None
            queue.turn = queue.waiting = False
        self._idle = list(self._queues.values())

    # ---------------------------------------------------------------- commits

    def commit(self) -> None:
        """Commit everything poll returned so far and wait for the broker's answer."""
        self._check_open()
        with self._polling:
            self._mark_consumed()
            try:
                self._send_commit(list(self._queues.values()), wait=True)
            except TransportError:
                self._lost()
                raise

    def committed(self) -> dict[QueueKey, int]:
        """The offsets this consumer knows the broker has committed, per assigned queue."""
        return {key: q.committed for key, q in self._queues.items()}

    def _send_commit(self, queues: list[_Queue], wait: bool) -> None:
        changed = [(q, q.consumed) for q in queues if q.consumed != q.committed]
        if not changed:
            return
        header = {"group": self.group, "offsets": [[q.topic, q.queue_id, off] for q, off in changed]}
        if wait:
            self._call(Code.COMMIT_OFFSETS, header)
            for queue, offset in changed:
                queue.committed = offset
        else:
            self._commits[self._write(Code.COMMIT_OFFSETS, header)] = changed

    # ---------------------------------------------------------------- requests

    def _write(self, code: int, header: dict[str, Any]) -> int:
        return self._conn.write(self._frame(code, header))

    def _write_frames(self, requests: list[tuple[int, dict[str, Any]]]) -> list[int]:
        """Several requests in one write where the transport can (write_many); their ids."""
        frames = [self._frame(code, header) for code, header in requests]
        if self._write_many is not None:
            return self._write_many(frames)
        return [self._conn.write(frame) for frame in frames]

    def _frame(self, code: int, header: dict[str, Any]) -> Frame:
        if self._signer is not None:
            header = signed_header(self._signer, code, header, b"")
        return Frame(int(code), 0, 0, header, b"")

    def _call(self, code: int, header: dict[str, Any]) -> Frame:
        """A request answered before this returns; pull answers read meanwhile wait in _ready."""
        timeout = self.request_timeout
        request_id = self._write(code, header)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            frame = self._conn.read(remaining) if remaining > 0 else None
            if frame is None:
                self._conn.close()
                self._lost()
                raise RequestTimeoutError(f"no response to request {request_id} within {timeout}s",
                                          request_id=request_id, timeout=timeout)
            self._heard = time.monotonic()
            if frame.request_id == request_id:
                return raise_for_error(frame)
            self._route(frame)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the LitePullConsumer is closed")

    # ---------------------------------------------------------------- shutdown

    def close(self, timeout: float = 10.0) -> None:
        """End a waiting poll (it returns []), commit the consumed offsets, leave the group.
        Messages of the last poll are not committed: call commit() first if they were handled."""
        if self._closed:
            return
        self._closed = True
        self._conn.interrupt()
        got = self._polling.acquire(timeout=timeout)
        try:
            self._conn.close()
            self._lost()
            try:
                self._send_commit(list(self._queues.values()), wait=True)
            except EQueueError as e:
                log.warning("closing LitePullConsumer: commit failed: %s", e)
            if self._mode == "subscribe" and self._owns_members:
                run_sync(self._members.close())  # leaves the group
            elif self._members_connected:
                run_sync(self._members.disconnect())
        finally:
            self._conn.close()
            if got:
                self._polling.release()

    def __enter__(self) -> LitePullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _id_prefix(info: Frame) -> str:
    from equeue_core.client.consumer import _id_prefix as of_address

    return of_address(info.header["address"])
