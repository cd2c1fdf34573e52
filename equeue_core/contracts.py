"""What a plugin must supply: the objects the hooks in hookspecs.py return.

The kernel calls only these methods. docs/plugins.md is the prose version; the conformance kits in
tests/conformance/ are the executable version, and every built-in plugin passes them.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from equeue_core.frame import Frame

# ---------------------------------------------------------------- storage


@dataclass(slots=True)
class StoreSettings:
    """What every store factory is given. `options` is the `[store_options.<name>]` config table."""

    data_dir: str
    flush: str = "async"  # "async" | "sync"
    flush_interval_ms: int = 500
    options: dict[str, Any] = field(default_factory=dict)
    # the largest batch append() may be given (the broker passes max_frame_size); 0 = not known.
    # A store with a size limit (the file store's chunk) refuses to open below it.
    max_batch_bytes: int = 0


@dataclass(frozen=True, slots=True)
class IndexRange:
    """Queue offsets first_offset..last_offset (both included) of one queue."""

    topic: str
    queue_id: int
    first_offset: int
    last_offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.queue_id} offsets {self.first_offset}..{self.last_offset}"


@dataclass(slots=True)
class RecoveryReport:
    """What `MessageStore.open` found: was the last stop clean, and what recovery dropped or rebuilt.

    `rebuilt`: index ranges recovery (re)wrote from the log (the records are there and readable).
    `lost`: offsets the store had handed out whose records recovery could not find (a torn tail
    cut off, an unreadable stretch of the log); their offsets are never handed out again, and
    a read of one raises CorruptRecordError. Both empty after a clean stop with intact files."""

    clean: bool
    truncated_bytes: int = 0
    rebuilt_entries: int = 0
    records: int = 0
    notes: list[str] = field(default_factory=list)
    rebuilt: list[IndexRange] = field(default_factory=list)
    lost: list[IndexRange] = field(default_factory=list)


@dataclass(slots=True)
class AppendResult:
    first_queue_offset: int
    positions: list[int]
    end_position: int  # durable once MessageStore.wait_flushed(end_position) resolves


@dataclass(slots=True)
class PullResult:
    records: bytes | bytearray | memoryview  # matching records, concatenated, as stored
    count: int
    next_offset: int  # next queue offset to ask for (past every entry scanned, matched or not)
    min_offset: int
    max_offset: int  # one past the last offset written


@runtime_checkable
class QueueIndex(Protocol):
    """(topic, queue id, queue offset) -> (position, size, tag hash), as packed record.INDEX_ENTRY.

    Rebuildable from the message store, so it may lag the log after a crash; the engine brings it
    up to date when it opens. The engine opens and closes it together with its other parts.
    """

    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None: ...
    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> memoryview: ...
    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def queues(self) -> dict[str, list[int]]: ...
    def flush(self) -> None: ...


@runtime_checkable
class MessageStore(Protocol):
    """The broker's store of records. One writer (the broker's event loop thread) calls append;
    reads may come from any thread, and so may delete_before (see there). Nothing here may block
    the writer on an fsync: durability is reported through wait_flushed."""

    def append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        """Store a batch for one queue. `batch` holds records laid out by record.py with crc,
        position, queue offset and store time zero; `starts` is record.scan(batch). The store
        assigns consecutive queue offsets and positions, stamps and seals them
        (record.stamp_batch), writes the bytes once, and indexes them. Store times never go
        backwards within a store, across restarts included."""
        ...

    def wait_flushed(self, end_position: int) -> concurrent.futures.Future:
        """A future resolved once every record ending at or before end_position is durable."""
        ...

    def read_queue(self, topic: str, queue_id: int, offset: int, max_count: int,
                   max_bytes: int, tag_hashes: frozenset[int] | None = None) -> PullResult:
        """Up to max_count records from offset on whose tag hash is in tag_hashes (all if None).
        offset == max offset gives an empty result; below the min or above the max raises
        OffsetOutOfRangeError(min_offset=, max_offset=)."""
        ...

    def read_position(self, position: int) -> bytes:
        """The record stored at position (for lookup by msg id); MessageNotFoundError if none."""
        ...

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def queues(self) -> dict[str, list[int]]: ...

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset whose store time is >= ts_ms (the max offset if none)."""
        ...

    def delete_before(self, position: int) -> int:
        """Retention: drop stored data wholly below position (at the store's granularity: whole
        chunks for the file store); reads of it then raise OffsetOutOfRangeError and queue
        minimums move past it. Returns the number of bytes released. The broker calls it from a
        worker thread while the writer appends: the store makes that safe itself."""
        ...

    def reusable_bytes(self) -> int:
        """Bytes inside the store's files that are free for its own reuse but not given back to
        the file system (LMDB keeps freed pages in its file); 0 for a store whose deletes shrink
        its files. The disk-relief check counts them as free."""
        ...

    def flush(self) -> None: ...


@runtime_checkable
class ConsumerOffsets(Protocol):
    """Consumer offsets per (group, topic, queue): the next offset each group will consume.
    Thread-safe: the broker commits on its event loop and persists (an fsync) on another thread.
    commit raises InvalidOffsetError for a value the store cannot keep, and leaves every other
    offset as it was; persist never drops a committed offset it can keep."""

    def get(self, group: str, topic: str, queue_id: int) -> int | None: ...
    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Remember the offset (in memory; durable after the next persist)."""
        ...
    def all(self) -> dict[tuple[str, str, int], int]: ...
    def delete_group(self, group: str) -> None: ...
    def persist(self) -> None:
        """Make every committed offset durable, atomically."""
        ...


@runtime_checkable
class TopicDefinitions(Protocol):
    """The broker's topics: name -> queue count. save is durable before it returns."""

    def load(self) -> dict[str, int]: ...
    def save(self, topics: Mapping[str, int]) -> None: ...


@dataclass(slots=True)
class ScheduleQueueProgress:
    """How far the scheduler has delivered one waiting queue: every offset below next_offset,
    and the offsets in delivered (all >= next_offset), have been copied to their real topics."""

    next_offset: int
    delivered: frozenset[int] = frozenset()


@dataclass(slots=True)
class ScheduleState:
    """Everything the scheduler persists (equeue_core/broker/schedule.py explains it): the
    progress of each waiting queue, keyed by (topic, queue id) -- the delay-level queues of
    `%SCHEDULE%` and the buckets of the `%TIMER%` ring -- and the ring's layout and the start of
    its oldest bucket still open (None until the ring first exists)."""

    queues: dict[tuple[str, int], ScheduleQueueProgress] = field(default_factory=dict)
    timer_open_from: int | None = None
    timer_bucket_ms: int | None = None
    timer_buckets: int | None = None


@runtime_checkable
class SchedulerProgress(Protocol):
    """The scheduler's delivery state. save is durable before it returns and replaces the whole
    saved state; load of a store that never saved one returns an empty ScheduleState."""

    def load(self) -> ScheduleState: ...
    def save(self, state: ScheduleState) -> None: ...


@runtime_checkable
class ReplicaLog(Protocol):
    """The message store's log as raw bytes, for master/replica replication (docs/replication.md).

    A position is the store's own record position (a byte offset of its log). A replica stores
    the records exactly as the master stamped them: same positions, queue offsets and crc, so a
    record has one identity in the whole broker group. Writer-thread methods (append_log,
    truncate_log) run on the store's single writer, never beside MessageStore.append."""

    def end_position(self) -> int:
        """One past the last record stored (and readable through read_log)."""
        ...

    def start_position(self) -> int:
        """The first position still stored (retention moves it up); end_position() when empty."""
        ...

    def read_log(self, position: int, max_bytes: int) -> bytes:
        """Whole records from `position` on, as stored (stamped position, queue offset, crc), at
        most max_bytes unless the first record alone is larger; b"" at the end. `position` must
        be a record start or the end; the store may skip its own padding there (the file store's
        end-of-chunk marker): the first record's stamped position says where the bytes start.
        StoreError if position is not a record boundary or no longer stored."""
        ...

    def append_log(self, position: int, data: bytes | bytearray | memoryview) -> int:
        """Store records read by another store's read_log(position, ...): `position` must be
        this store's end_position() (else StoreError: a gap or an overlap), every record must
        verify and continue its queue's offsets. Indexes them; returns the new end position,
        durable once MessageStore.wait_flushed(end) resolves."""
        ...

    def truncate_log(self, position: int) -> None:
        """Drop every record at and after position (a record boundary), with its index entries,
        durably before returning; the queues end where their last kept record ends."""
        ...


@runtime_checkable
class StoreEngine(Protocol):
    """One store plugin's parts on one data directory, opened together by its factory (which
    recovers after a crash and takes the data directory's single-writer lock: a second writer,
    in this process or another, gets StoreLockedError) and closed together by close().

    The parts share whatever handle the engine holds, so none of them needs a registry."""

    recovery: RecoveryReport  # what opening found and repaired
    messages: MessageStore
    index: QueueIndex  # the messages' own index (tests and tools read it; the broker asks messages)
    offsets: ConsumerOffsets
    topics: TopicDefinitions
    schedule: SchedulerProgress
    replica_log: ReplicaLog  # the log as raw bytes, for replication

    def close(self) -> None:
        """Persist offsets, flush, leave a clean-shutdown mark, release files and the lock.
        Idempotent."""
        ...


@runtime_checkable
class StoreReader(Protocol):
    """Read-only view of a data directory from another process (Spark), while the broker runs.

    Every offset below queue_range()[1] is an intact record: a reader never sees a torn one.
    A reader never takes the writer lock."""

    def queues(self) -> dict[str, list[int]]: ...
    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int: ...
    def export(self, topic: str, queue_id: int, start: int, end: int,
               batch_rows: int = 65536, columns: Sequence[str] | None = None,
               row_filter: Any = None) -> Iterator[Any]:
        """pyarrow.RecordBatch objects (equeue_core.export.arrow_schema(columns)) for offsets
        [start, end): only `columns` (default all), without the rows an
        equeue_core.export.RowFilter rejects (default none)."""
        ...
    def group_offsets(self) -> dict[tuple[str, str, int], int]: ...
    def close(self) -> None: ...


StoreEngineFactory = Callable[[StoreSettings], StoreEngine]
StoreReaderFactory = Callable[[str, dict[str, str]], StoreReader]

# ---------------------------------------------------------------- transport


@dataclass(slots=True)
class TransportSettings:
    max_frame_size: int = 16 * 1024 * 1024
    connect_timeout: float = 5.0
    # A connection that has sent part of a frame and nothing more for this long is closed
    # (slow-loris); an idle connection between frames is not.
    frame_read_timeout: float = 30.0
    socket_buffer: int = 4 * 1024 * 1024
    # Per server connection (equeue_core.admission): requests start only while its unsent
    # responses plus its unanswered requests stay within this many bytes, at most
    # max_requests_in_flight at once; the rest wait and the connection is not read meanwhile.
    max_connection_bytes: int = 64 * 1024 * 1024
    max_requests_in_flight: int = 4096
    # Connections a server accepts at once; one more gets a too_many_connections error.
    max_connections: int = 4096
    # A server connection with nothing received and nothing being handled (a held pull counts as
    # being handled) for this many seconds is closed; 0 = never.
    idle_timeout: float = 600.0
    # TLS (docs/security.md). Server: tls_cert + tls_key serve TLS, tls_ca requires client
    # certificates signed by that CA. Client (the tls:// scheme): tls_ca verifies the server
    # (system CAs if empty), tls_cert + tls_key present a client certificate.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    # CURVE (ZeroMQ transport, docs/security.md), keys as Z85 text. Server: curve_secret_key (with
    # curve_public_key) serves CURVE only; curve_allowed_keys is a file or directory of the client
    # public keys let in ("" = any key: encryption without client authentication). Client:
    # curve_server_key (the server's public key) turns CURVE on; curve_public_key/curve_secret_key
    # is the client's own pair (an ephemeral one if empty).
    curve_secret_key: str = ""
    curve_public_key: str = ""
    curve_server_key: str = ""
    curve_allowed_keys: str = ""


class ServerConnection(Protocol):
    id: int
    peer: str

    @property
    def closed(self) -> bool: ...

    def push(self, frame: Frame) -> None:
        """Send a frame the client did not ask for (flags include FLAG_PUSH). Best effort."""
        ...


class ServerHandler(Protocol):
    async def handle(self, conn: ServerConnection, frame: Frame) -> Frame | None:
        """Answer a request; None for a one-way frame. Calls start in arrival order per connection."""
        ...

    def connection_lost(self, conn: ServerConnection) -> None: ...


class ImmediateServerHandler(ServerHandler, Protocol):
    """Optional: a handler that can answer some requests without a task. A server transport that
    finds `now_codes` and `handle_now` on its handler calls `handle_now(conn, frame)` for a frame
    whose code is in `now_codes`, at arrival, when no earlier request of that connection is still
    waiting for its task to start (so per-connection arrival order of the synchronous parts
    holds); every other frame goes to `handle` in a task as before. A transport may ignore this
    and always call `handle`: the answers are the same.

    `handle_now` has done the request's synchronous part when it returns: a Frame (the answer)
    or None (no answer: one-way) means it is finished; anything else is an awaitable of the
    answer (Frame | None) that the transport awaits in a task. It answers errors itself (error
    frames), like `handle`. An awaitable that also has `listen(callback)` (a late answer,
    equeue_core.broker.long_poll.LateAnswer: a held pull) may instead be given a callback, which
    it calls synchronously with the answer when the answer is ready, so the transport can write
    it in that loop turn; the transport then does not await it, and cancels it if the connection
    goes away first."""

    now_codes: frozenset[int]

    def handle_now(self, conn: ServerConnection, frame: Frame) -> Frame | None | Awaitable[Frame | None]: ...


class Server(Protocol):
    address: tuple[str, int]  # as bound (port 0 resolved)

    async def close(self) -> None: ...


class ClientConnection(Protocol):
    @property
    def closed(self) -> bool: ...

    async def request(self, frame: Frame, timeout: float) -> Frame:
        """Send a request (the transport assigns request_id) and await its response frame.
        Raises RequestTimeoutError, ConnectionLostError, FrameTooLargeError."""
        ...

    async def send_oneway(self, frame: Frame) -> None: ...
    async def close(self) -> None: ...


class CallbackRequestConnection(ClientConnection, Protocol):
    """Optional on top of ClientConnection (tcp and tls offer it): a request written now, on the
    loop thread, whose answer goes to a callback instead of an awaiting task. A client's hot path
    (the Producer's `send_async` batches) then goes from an answer to its next write in one loop
    turn, where awaiting `request` took three; each turn waits for a GIL switch while a busy
    caller's thread holds the GIL."""

    def request_now(self, code: int, header: bytes, body: bytes, timeout: float, done: Any) -> bool:
        """On the loop thread: write one request whose header map is encoded
        (frame.encode_header), in this call. `done(request)` then runs once on the loop thread,
        where `request.result()` is the response frame and `request.exception()` a
        TransportError (past `timeout`, checked about once a second; connection lost) or None.
        False: nothing written and `done` will not run, because `request` would have to wait
        (not connected, or writers waiting their turn that this write would overtake); the caller
        then uses `request`. FrameTooLargeError: nothing written."""
        ...


class ThreadWritableConnection(ClientConnection, Protocol):
    """Optional on top of ClientConnection (tcp without TLS offers it): a request written from a
    caller's thread, not the loop's, for a blocking producer's lone `send_async` (its lane,
    client/producer.py): the frame leaves without waking the loop thread, whose only part is to
    read the answer. The connection is used for nothing else (the loop's own writes could
    interleave with a thread's)."""

    @property
    def thread_writable(self) -> bool:
        """Whether write_from_thread can write on this connection at all (a connection that
        would refuse every write says False, and a client keeps to its loop path)."""
        ...

    def write_from_thread(self, loop: Any, code: int, header: bytes, body: bytes, timeout: float,
                          done: Any) -> bool:
        """Write one request whose header map is encoded (frame.encode_header). `done(request)`
        then runs once on `loop`'s thread, where `request.result()` is the response frame and
        `request.exception()` a TransportError (past `timeout`, checked about once a second;
        connection lost) or None. False: nothing written and `done` will not run (not connected:
        the transport reconnects on its own; the kernel would not take the whole frame at once).
        FrameTooLargeError: nothing written."""
        ...


class BlockingClientConnection(Protocol):
    """Optional: a transport may offer `connect_blocking(host, port, settings)` returning one of
    these, for requests made in the caller's own thread (a synchronous `Producer.send` then needs
    no hop through the client's loop thread). One request at a time; the caller serializes."""

    def request(self, frame: Frame, timeout: float) -> Frame:
        """Send a request (the transport assigns request_id) and wait for its response frame.
        Raises RequestTimeoutError, ConnectionLostError, FrameTooLargeError."""
        ...

    def close(self) -> None: ...


class PipelinedBlockingConnection(BlockingClientConnection, Protocol):
    """Optional on top of BlockingClientConnection (tcp and tls offer it): many requests in
    flight on the one socket, for the LitePullConsumer's held pulls (client/lite_pull.py)."""

    def write(self, frame: Frame) -> int:
        """Send a request without waiting; its request id (the transport assigns it)."""
        ...

    def write_many(self, frames: list[Frame]) -> list[int]:
        """Send several requests without waiting, in order and in as few writes as the
        transport can; their request ids. FrameTooLargeError for any of them: none is sent."""
        ...

    def read(self, timeout: float) -> Frame | None:
        """The next frame that arrives (any request id), None when none did within timeout;
        the connection and the requests in flight stay as they are on a timeout."""
        ...

    def interrupt(self) -> None:
        """From another thread: end a waiting `read` (it raises ConnectionLostError)."""
        ...


@runtime_checkable
class Transport(Protocol):
    name: str

    async def serve(self, host: str, port: int, handler: ServerHandler,
                    settings: TransportSettings) -> Server: ...

    async def connect(self, host: str, port: int, settings: TransportSettings,
                      on_push: Callable[[Frame], None] | None = None) -> ClientConnection: ...


# ---------------------------------------------------------------- strategies

AllocationStrategy = Callable[[Any, Sequence[Any], Sequence[Any]], list]
"""(consumer_id, all queues, all consumer ids) -> the queues this consumer takes."""


class QueueSelector(Protocol):
    def select(self, queue_ids: Sequence[int], routing_key: str | None) -> int: ...


QueueSelectorFactory = Callable[[], QueueSelector]
PushCallback = Callable[[Frame], Awaitable[None] | None]


# ---------------------------------------------------------------- access control


class Authorizer(Protocol):
    """Decides whether a request may run (docs/security.md). `authorize` runs on the broker's event
    loop before every handler: it must be cheap (no I/O) and raise AccessDeniedError, naming what
    was refused but never a secret. Returns the account name (for logs)."""

    def authorize(self, frame: Frame, peer: str) -> str: ...

    def close(self) -> None: ...
