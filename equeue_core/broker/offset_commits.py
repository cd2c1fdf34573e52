"""Checking a COMMIT_OFFSETS request before any of it is committed.

The whole request is refused when one entry is bad, and nothing of it is committed: the client
gets one InvalidOffsetError naming the first bad entry and knows exactly what was saved (nothing
from this request; everything from earlier ones). A good entry is never lost because a bad one
travelled with it. Checked: the shape, the limits every store keeps (equeue_core/offset_limits.py),
a valid topic name and a queue id below the largest queue count. Not checked: that the topic
still exists, so a consumer whose topic an admin just deleted does not have its other offsets
refused with it.
"""

from __future__ import annotations

from equeue_core.broker.topics import MAX_QUEUES, check_topic_name
from equeue_core.errors import InvalidOffsetError, InvalidTopicError, ProtocolError
from equeue_core.offset_limits import check_offset

SHAPE = "offsets must be a list of [topic, queue_id, offset]"


def checked_entries(group: str, entries: object) -> list[tuple[str, int, int]]:
    """Every entry as (topic, queue_id, offset), or the error of the first bad one."""
    if not isinstance(entries, list):
        raise ProtocolError(SHAPE)
    out = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 3:
            raise ProtocolError(SHAPE)
        topic, queue_id, offset = entry
        check_offset(group, topic, queue_id, offset)
        try:
            check_topic_name(topic, allow_system=True)
        except InvalidTopicError as e:
            raise InvalidOffsetError(f"offset [{group!r:.40}, {topic!r:.40}, {queue_id}, {offset}]: {e}") from None
        if queue_id >= MAX_QUEUES:
            raise InvalidOffsetError(f"offset [{group!r:.40}, {topic!r}, {queue_id}, {offset}]: "
                                     f"no topic has a queue {queue_id} (at most {MAX_QUEUES} queues)")
        out.append((topic, queue_id, offset))
    return out
