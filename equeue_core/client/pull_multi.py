"""A client's side of PULL_MULTI (broker/multi_pull.py, docs/protocol.md code 32): each section of
the answer handed back as the answer its queue's own PULL would have had, so the code that takes
a PULL's answer takes these unchanged (the LitePullConsumer's `_take`).

The push Consumer does not send PULL_MULTI: sending its slot-holding queues' pulls together (on
the loop, half the slots at a time or after 2 ms) made its 4-queue drain 20 % slower and its
1000-queue drain no faster (docs/benchmarks.md, "Many queues in one pull").
"""

from __future__ import annotations

from equeue_core.codes import Code
from equeue_core.frame import FLAG_ERROR, FLAG_RESPONSE, Frame


def answer_parts(frame: Frame) -> list[Frame]:
    """Each result of a PULL_MULTI answer, in the request's order, as the Frame its queue's PULL
    would have been answered with: the header fields of a PULL answer and a view of its records,
    or an error frame. Fewer parts than sections: the rest were not read (the answer's byte
    budget) and are pulled again."""
    rid = frame.request_id
    body = memoryview(frame.body)
    parts = []
    pos = 0
    for result in frame.header.get("results") or ():
        if type(result) is dict:
            parts.append(Frame(Code.PULL, rid, FLAG_RESPONSE | FLAG_ERROR, result, b""))
            continue
        status, next_offset, min_offset, max_offset, count, length = result
        parts.append(Frame(Code.PULL, rid, FLAG_RESPONSE,
                           {"status": status, "next_offset": next_offset, "min_offset": min_offset,
                            "max_offset": max_offset, "count": count}, body[pos:pos + length]))
        pos += length
    return parts
