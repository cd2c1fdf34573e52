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
- A consumer's tag filter (`tags`) is applied where the records are decoded (decoded_chunks, the
  orderly loop, a LitePullConsumer's poll), never by decoding the whole answer first.
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

    __slots__ = ("buf", "starts", "id_prefix", "nbytes", "cursor", "open", "tags", "dropped")

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
        # records decoded_chunks left out for the tag filter so far: finished without the
        # handler, and so not counted as handled (len(batch) - dropped reached it, or will)
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.starts)

    def decode(self, i: int, j: int) -> list[ReceivedMessage]:
        """Records [i, j) as ReceivedMessage objects."""
        starts = self.starts
        end = starts[j] if j < len(starts) else self.nbytes
        return decode_batch(self.buf[starts[i]:end], self.id_prefix)

    def decode_kept(self, i: int, j: int) -> list[ReceivedMessage]:
        """The records of [i, j) the batch's tag filter keeps, decoded (all of them without one);
        what it drops, the caller finishes with the rest."""
        msgs = self.decode(i, j)
        tags = self.tags
        return msgs if tags is None else [m for m in msgs if m.tag in tags]

    def offset_at(self, i: int) -> int:
        """Record i's queue offset."""
        return _QUEUE_OFFSET.unpack_from(self.buf, self.starts[i] + _QUEUE_OFFSET_AT)[0]


def dropped(msgs: list[ReceivedMessage] | PulledBatch) -> int:
    """How many of a batch's records the tag filter left out so far (finished, not handled)."""
    return msgs.dropped if type(msgs) is PulledBatch else 0


class ResultsAt:
    """A chunk's results written to its records' places in the whole batch's results: result i
    of the chunk goes to results[places[i]] (a chunk a tag filter thinned, decoded_chunks)."""

    __slots__ = ("results", "places")

    def __init__(self, results: list[bool | None], places: list[int]) -> None:
        self.results = results
        self.places = places

    def __getitem__(self, i: int) -> bool | None:
        return self.results[self.places[i]]

    def __setitem__(self, i: int, ok: bool) -> None:
        self.results[self.places[i]] = ok


def decoded_chunks(batch: PulledBatch, handler_batch: int,
                   results: list[bool | None]) -> Iterator[tuple[list[ReceivedMessage], list[bool | None] | ResultsAt, int]]:
    """(messages, out, base) of each chunk of `batch`, decoded just before it is handed out: about
    DECODE_CHUNK records at a time, a whole number of `handler_batch`-sized handler calls (a
    handler that takes lists gets them whole). The chunk's message i has its result at
    out[base + i] (run_handler's contract), which is its record's place in `results`, the whole
    batch's. A chunk's messages are freed once the caller drops them, before the next is made.

    The batch's tag filter is applied here, to each chunk as it is decoded. The broker filters
    pulls by a 64-bit tag hash, so a record of another tag reaches the client only on a hash
    collision. Such a record is left out of its chunk, its result set True at once (finished: the
    batch can end and be committed past it) and counted in `batch.dropped`; the kept ones of that
    chunk are written through a ResultsAt. Only dropped records are marked before the run: a run
    halted midway leaves the kept ones it never ran None (not finished)."""
    n = len(batch)
    step = handler_batch * max(1, DECODE_CHUNK // handler_batch)
    tags = batch.tags
    for lo in range(0, n, step):
        msgs = batch.decode(lo, min(n, lo + step))
        if tags is not None:
            kept: list[ReceivedMessage] = []
            places: list[int] = []
            for i, m in enumerate(msgs, lo):
                if m.tag in tags:
                    kept.append(m)
                    places.append(i)
                else:
                    results[i] = True
            if len(kept) < len(msgs):
                batch.dropped += len(msgs) - len(kept)
                yield kept, ResultsAt(results, places), 0
                continue
        yield msgs, results, lo
