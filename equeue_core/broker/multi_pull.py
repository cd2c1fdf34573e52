"""PULL_MULTI: the next records of several queues in one request and one answer (docs/protocol.md).

Why a second pull request: a PULL asks one queue for its next records, and every PULL costs both
ends the same whatever it brings back: a frame written and read, a parse, a dispatch, an answer, a
wake-up. A consumer catching up on 4 queues pulls ~1024 records a time; on 1000 queues of the same
backlog it pulls ~300 a time, so the same messages cost it three to five times the pulls, and the
drain ran at 0.76x (docs/benchmarks.md, "Many queues in one pull"). With PULL_MULTI a consumer asks
for the queues waiting for a pull in one frame, and gets their records back in one. Kafka's fetch
request carries every partition a consumer reads from one broker for the same reason.

What the broker promises, section by section: each is read exactly as a PULL of its topic, queue,
offset, max_count and tags would be on its first read (the same status, offsets and records;
OFFSET_RESET for an offset out of range unless `strict`). A PULL_MULTI is never held: a queue with
nothing new is answered `no_new` at once (a consumer long-polls a caught-up queue with a PULL). A
section that fails (an unknown queue, a corrupt record) is answered with its error and the others
are read on. The answer's records fit one byte budget (the broker's pull_max_bytes): the sections
that would pass it are left out of the answer, the results stopping before them, and the consumer
pulls them again. The first section is always read, as a lone PULL would be.
"""

from __future__ import annotations

from typing import Any

from equeue_core.codes import MAX_PULL_COUNT
from equeue_core.codes import MAX_PULL_SECTIONS as MAX_SECTIONS
from equeue_core.errors import EQueueError, ProtocolError

# bytes of the answer's header kept per section, out of the frame's room for records: its result
# list, or an error with its message cut to ERROR_MESSAGE_CHARS and string details of at most
# DETAIL_CHARS (a topic name's longest; a longer one is left out, as a value a detail cannot carry is)
SECTION_ROOM = 512
ERROR_MESSAGE_CHARS = 200
DETAIL_CHARS = 127

Pull = tuple[str, int, int, int, frozenset | None]


def parse_pulls(header: dict[str, Any]) -> list[Pull]:
    """(topic, queue_id, offset, max_count, tag hashes or None) of each section: the `pulls` field
    checked (ProtocolError naming what is wrong). Topic names and queue ids are the caller's to
    check, per section, as a PULL's are."""
    pulls = header.get("pulls")
    if type(pulls) is not list or not pulls:
        raise ProtocolError("header field 'pulls' must be a non-empty list of "
                            "[topic, queue_id, offset, max_count, tags]")
    if len(pulls) > MAX_SECTIONS:
        raise ProtocolError(f"a pull_multi asks at most {MAX_SECTIONS} queues, not {len(pulls)}")
    out = []
    for i, pull in enumerate(pulls):
        if type(pull) is not list or len(pull) != 5:
            raise ProtocolError(f"pull {i} must be [topic, queue_id, offset, max_count, tags]")
        topic, queue_id, offset, max_count, tags = pull
        if type(topic) is not str:
            raise ProtocolError(f"pull {i}: the topic must be a string")
        if type(queue_id) is not int:
            raise ProtocolError(f"pull {i}: the queue id must be an integer")
        if type(offset) is not int:
            raise ProtocolError(f"pull {i}: the offset must be an integer")
        if type(max_count) is not int:
            raise ProtocolError(f"pull {i}: max_count must be an integer")
        if tags is not None and (type(tags) is not list or any(type(t) is not int for t in tags)):
            raise ProtocolError(f"pull {i}: tags must be a list of tag hashes, or nil")
        max_count = 1 if max_count < 1 else MAX_PULL_COUNT if max_count > MAX_PULL_COUNT else max_count
        out.append((topic, queue_id, offset, max_count, frozenset(tags) if tags else None))
    return out


def records_budget(pull_max_bytes: int, max_frame_size: int, header_room: int, sections: int) -> int:
    """Bytes of records one answer of `sections` sections may carry: the broker's pull_max_bytes,
    within the frame once its header has room for every section's result."""
    return max(1, min(pull_max_bytes, max_frame_size - header_room - sections * SECTION_ROOM))


def error_result(e: EQueueError) -> dict[str, Any]:
    """A failed section's result: the error answer a PULL would get, its message cut short."""
    return {"error": e.code, "message": str(e)[:ERROR_MESSAGE_CHARS], "details": e.wire_details(DETAIL_CHARS)}
