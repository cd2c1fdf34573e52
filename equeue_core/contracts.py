"""What a plugin must supply: the objects the hooks in hookspecs.py return.

The kernel calls only these methods. docs/plugins.md is the prose version; the conformance kits in
tests/conformance/ are the executable version, and every built-in plugin passes them.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Awaitable, Callable, Iterator, Sequence
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

    Rebuildable from the message store, so it may lag the log after a crash; the message store
    that owns it brings it up to date in `MessageStore.open`.
    """

    def add(self, topic: str, queue_id: int, first_offset: int, entries: bytes | bytearray) -> None: ...
    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> memoryview: ...
    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def queues(self) -> dict[str, list[int]]: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class MessageStore(Protocol):
    """The broker's store of records. One writer (the broker's event loop thread) calls append;
    reads may come from any thread. Nothing here may block the writer on an fsync: durability is
    reported through wait_flushed."""

    def open(self) -> RecoveryReport: ...

    def append(self, topic: str, queue_id: int, batch: bytearray, starts: Sequence[int]) -> AppendResult:
        """Store a batch for one queue. `batch` holds records laid out by record.py with crc,
        position, queue offset and store time zero; `starts` is record.scan(batch). The store
        assigns consecutive queue offsets and positions, stamps and seals them
        (record.stamp_batch), writes the bytes once, and indexes them."""
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
        chunks for the file store); reads of it then raise OffsetOutOfRangeError. Returns the
        number of bytes released."""
        ...

    def flush(self) -> None: ...

    def close(self) -> None:
        """Flush, leave a clean-shutdown mark, release files. The store owns the queue index it
        was given and closes it too (the broker closes only the store and the offset store)."""
        ...


@runtime_checkable
class OffsetStore(Protocol):
    """Consumer offsets per (group, topic, queue) and small broker metadata, persisted atomically.
    Thread-safe: the broker commits on its event loop and persists (an fsync) on another thread."""

    def get(self, group: str, topic: str, queue_id: int) -> int | None: ...
    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...
    def all(self) -> dict[tuple[str, str, int], int]: ...
    def delete_group(self, group: str) -> None: ...
    def get_meta(self, key: str) -> bytes | None: ...
    def put_meta(self, key: str, value: bytes) -> None:
        """Store and persist a metadata value (topics, schedule progress) before returning."""
        ...
    def persist(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class StoreReader(Protocol):
    """Read-only view of a data directory from another process (Spark), while the broker runs.

    Every offset below queue_range()[1] is an intact record: a reader never sees a torn one."""

    def queues(self) -> dict[str, list[int]]: ...
    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int: ...
    def export(self, topic: str, queue_id: int, start: int, end: int,
               batch_rows: int = 65536) -> Iterator[Any]:
        """pyarrow.RecordBatch objects (equeue_core.export.ARROW_SCHEMA) for offsets [start, end)."""
        ...
    def group_offsets(self) -> dict[tuple[str, str, int], int]: ...
    def close(self) -> None: ...


QueueIndexFactory = Callable[[StoreSettings], QueueIndex]
MessageStoreFactory = Callable[[StoreSettings, QueueIndex], MessageStore]
OffsetStoreFactory = Callable[[StoreSettings], OffsetStore]
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
