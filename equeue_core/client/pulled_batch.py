"""PulledBatch: one pull answer's records, kept as the answer's bytes until a worker hands them out.

Why not a ReceivedMessage per record at pull time: a pulled batch waits (flow control lets up to
flow_max_messages per queue be in flight) before a handler thread gets to it, and hundreds of
live objects per pull made the cyclic garbage collector the largest cost of consuming (it scanned
every waiting message once or twice per pull and promoted them to older generations). Kept as
bytes, a waiting batch is a few objects; the worker decodes it in chunks of DECODE_CHUNK just
before it calls the handler, so the messages live for one chunk (unless the handler keeps them)
and are freed before the collector's young-generation threshold is reached.

Guarantees:
- The records are checked once, at construction (record.scan: sizes, magic, lengths), so a
  malformed answer raises CorruptRecordError on the pull loop, as decoding it there did.
- decode(i, j) gives records [i, j) as ReceivedMessage objects, the same as decode_batch over the
  whole answer would (the C decode_batch when built).
- offset_at(i) is record i's queue offset, read from its header (no decoding).
- Bookkeeping (client/process_queue.py): records [0, cursor) are finished; `open` is False once
  every record is.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from equeue_core import record
from equeue_core.client.message import ReceivedMessage, decode_batch

DECODE_CHUNK = 64  # records decoded at a time by a worker (well under the collector's 700)
# The most records a reader that keeps them while it works through them decodes at once (a
# LitePullConsumer's poll, an orderly consumer's pending run): each message is two objects the
# collector counts (the message and its properties dict), and 700 more of those than were freed
# start a young collection, which promotes every message still alive (docs/benchmarks.md,
# "Queue count, sixth pass")
DECODE_AT_MOST = 256
_QUEUE_OFFSET = struct.Struct("<Q")
_QUEUE_OFFSET_AT = 20  # the queue offset's place in a record header (docs/format.md)


class PulledBatch:
    """The records of one pull answer (see the module docstring)."""

    __slots__ = ("buf", "starts", "id_prefix", "nbytes", "cursor", "open", "tags")

    def __init__(self, body: bytes | bytearray | memoryview, id_prefix: str,
                 tags: frozenset[str] | None = None) -> None:
        self.buf = memoryview(body)
        # a consumer's tag filter for the records' topic (None: every record is the handler's);
        # the broker filters by tag hash, so a record may still be of another tag
        self.tags = tags
        self.starts = record.scan(self.buf)  # CorruptRecordError for a malformed answer
        self.id_prefix = id_prefix
        self.nbytes = len(self.buf)  # what the batch holds in memory until every record is finished
        self.cursor = 0  # records before this one are finished (handled, or failed and tracked alone)
        self.open = bool(self.starts)

    def __len__(self) -> int:
        return len(self.starts)

    def decode(self, i: int, j: int) -> list[ReceivedMessage]:
        """Records [i, j) as ReceivedMessage objects."""
        starts = self.starts
        end = starts[j] if j < len(starts) else self.nbytes
        return decode_batch(self.buf[starts[i]:end], self.id_prefix)

    def offset_at(self, i: int) -> int:
        """Record i's queue offset."""
        return _QUEUE_OFFSET.unpack_from(self.buf, self.starts[i] + _QUEUE_OFFSET_AT)[0]


def decoded_chunks(batch: PulledBatch, handler_batch: int = 1) -> Iterator[tuple[int, list[ReceivedMessage]]]:
    """(first index, messages) of each chunk of `batch`, decoded just before it is handed out:
    about DECODE_CHUNK messages at a time, a whole number of `handler_batch`-sized handler calls
    (a handler that takes lists gets them whole). A chunk's messages are freed once the caller
    drops them, before the next chunk is made."""
    n = len(batch)
    step = handler_batch * max(1, DECODE_CHUNK // handler_batch)
    for lo in range(0, n, step):
        yield lo, batch.decode(lo, min(n, lo + step))
