"""The producer's side of SEND_MULTI: several batches, of several topics, in one frame.

A producer sends a frame per batch, and a batch holds one topic's (one queue's) messages. Writing
to many topics at once, its batches are small and the frames many, and each frame costs both ends
the same whatever it carries, so batches waited for one of 8 frames in flight (at 50k msg/s over
100 topics: p99 5-11 ms, against 1.5-2 ms packed; docs/benchmarks.md, "Many topics in one frame").
So where the producer has several batches ready at one moment (the batches that waited for
room under `max_batches_in_flight`, or a flush) it packs them into SEND_MULTI frames of up to
`max_batch_bytes` each; the broker stores each section as the SEND of that batch
(broker/multi_send.py, docs/protocol.md). A batch's messages get the same results, or the same
error, as its own SEND would have given them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from equeue_core.client.connection import raise_for_error
from equeue_core.codes import MAX_MULTI_SECTIONS
from equeue_core.errors import EQueueError, error_for_code


def pack(items: Sequence[tuple[Any, Any]], limit: int) -> list[list[tuple[Any, Any]]]:
    """(key, batch) items, in order, cut into frames of at most `limit` bytes of batches each
    (a batch as large alone is a frame of its own) and at most MAX_MULTI_SECTIONS batches. Order
    is kept: frames, and the sections in them, go out in the order given."""
    frames: list[list[tuple[Any, Any]]] = []
    size = 0
    for item in items:
        n = item[1].size
        if not frames or not joins(frames[-1], size, n, limit):
            frames.append([item])
            size = n
        else:
            frames[-1].append(item)
            size += n
    return frames


def joins(frame: Sequence[Any], size: int, n: int, limit: int) -> bool:
    """Whether a batch of `n` bytes joins a frame of these sections holding `size` bytes: the
    one packing rule (`pack`, and the producer's _take_deferred)."""
    return size + n <= limit and len(frame) < MAX_MULTI_SECTIONS


def request_of(items: Sequence[tuple[Any, Any]]) -> tuple[dict[str, Any], bytes]:
    """A SEND_MULTI's header and body for (key, batch) items whose key starts with the topic and
    whose batch has its queue id, its record buffers (`parts`) and their length in bytes
    (`size`). The body is every batch's records back to back: batch i is body[offsets[i]:
    offsets[i] + size], which is how a transport failure sends each again on its own (`split`)."""
    sections = [[key[0], batch.queue, batch.size] for key, batch in items]
    return {"sections": sections}, b"".join(chain.from_iterable(batch.parts for _, batch in items))


def split(body: bytes, sizes: Sequence[int]) -> list[bytes]:
    """The batches of a SEND_MULTI body (request_of), given their sizes in order."""
    out = []
    start = 0
    for n in sizes:
        out.append(body[start:start + n])
        start += n
    return out


def all_stored(frame: Any, count: int) -> list[Any] | None:
    """The usual answer's sections, when the broker stored all `count` of them: each section's
    [first_offset, positions], in order (the id prefix is the header's). None for anything
    else (an error answer, a section not stored), which `outcomes` words section by section."""
    if frame.is_error:
        return None
    stored = frame.header.get("stored")
    if type(stored) is not list or len(stored) != count or "failed" in frame.header:
        return None
    return stored


def outcomes(frame: Any, count: int) -> list[tuple[tuple[str, int, list[int]] | None, EQueueError | None]]:
    """Each section's outcome from the broker's answer (`count` sections sent): ((id_prefix,
    first_offset, positions), None) when stored, (None, error) when not. An error answer fails
    every section with its error; an answer that stored only the first sections (a store
    failure) fails the rest with the error it names."""
    try:
        h = raise_for_error(frame).header
    except EQueueError as e:
        return [(None, e)] * count
    prefix = h["id_prefix"]
    out: list[tuple[tuple[str, int, list[int]] | None, EQueueError | None]] = [
        ((prefix, first, positions), None) for first, positions in h["stored"][:count]]
    if len(out) < count:
        failed = h.get("failed") if isinstance(h.get("failed"), dict) else {}
        code = str(failed.get("error", "error"))
        details = failed.get("details") if isinstance(failed.get("details"), dict) else {}
        err = error_for_code(code)(str(failed.get("message", f"not stored ({code})")), **details)
        out += [(None, err)] * (count - len(out))
    return out
