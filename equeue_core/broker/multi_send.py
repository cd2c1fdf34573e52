"""SEND_MULTI: the batches of several topics (and queues) in one request (docs/protocol.md).

Why a second send request: a producer's frame carries one (topic, queue) batch. A producer
writing to many topics at once has many small batches, one frame each, and every frame costs
both ends the same whatever it carries: a read, a parse, a dispatch, an answer, a wake-up. So a
producer held its batches back to at most 8 frames in flight, and over 100 topics each topic's
batch waited a dozen round trips for its turn. With SEND_MULTI every waiting topic leaves with
each answer: at 50k msg/s over 100 topics p99 fell from 5-11 to 1.5-2 ms and the broker's CPU
a message by 28 % (docs/benchmarks.md, "Many topics in one frame"). Kafka's produce request
carries every partition bound for one broker for the same reason.

What the broker promises, section by section: each section is stored exactly as the SEND of its
topic, queue and records would be, in the frame's order (so per-queue order holds within the
frame and across frames). The whole request is checked first (the sections' layout, each topic
and queue, each section's records): a request with any bad section is refused whole, nothing
stored. A store failure after that (a full disk) stops at that section: the answer gives the
results of the sections stored before it and the error of the rest, none of which was stored.
"""

from __future__ import annotations

from typing import Any

from equeue_core.codes import MAX_MULTI_SECTIONS as MAX_SECTIONS
from equeue_core.errors import EQueueError, ProtocolError


def parse_sections(header: dict[str, Any], body_size: int) -> list[tuple[str, int, int, int]]:
    """(topic, queue_id, start, end) of each section, its records being body[start:end]: the
    `sections` field checked against the body (ProtocolError naming what is wrong). Topic names
    and queue ids are the caller's to check, as a SEND's are."""
    sections = header.get("sections")
    if type(sections) is not list or not sections:
        raise ProtocolError("header field 'sections' must be a non-empty list of [topic, queue_id, length]")
    if len(sections) > MAX_SECTIONS:
        raise ProtocolError(f"a send_multi carries at most {MAX_SECTIONS} sections, not {len(sections)}")
    out = []
    start = 0
    for i, section in enumerate(sections):
        if type(section) is not list or len(section) != 3:
            raise ProtocolError(f"section {i} must be [topic, queue_id, length]")
        topic, queue_id, length = section
        if type(topic) is not str:
            raise ProtocolError(f"section {i}: the topic must be a string")
        if type(queue_id) is not int:
            raise ProtocolError(f"section {i}: the queue id must be an integer")
        if type(length) is not int or length <= 0:
            raise ProtocolError(f"section {i}: the length must be a positive integer")
        end = start + length
        out.append((topic, queue_id, start, end))
        start = end
    if start != body_size:
        raise ProtocolError(f"the sections' lengths add up to {start} bytes, the body has {body_size}")
    return out


def answer_header(stored: list[Any], failed: EQueueError | None, id_prefix: str) -> dict[str, Any]:
    """The response header: `stored` the AppendResults of the sections stored, in order; `failed`
    the error of the first section not stored (it and every later one were not stored)."""
    header: dict[str, Any] = {"stored": [[r.first_queue_offset, r.positions] for r in stored],
                              "id_prefix": id_prefix}
    if failed is not None:
        header["failed"] = {"error": failed.code, "message": str(failed),
                            "details": failed.wire_details()}
    return header
