"""What a consumer offset may be, in every store: the limits of the key-value stores' key layout
(equeue_core/kv/keys.py: u16 name lengths, u32 queue id, u64 offset), kept by the file store too
so that every store accepts exactly the same offsets."""

from __future__ import annotations

from equeue_core.errors import InvalidOffsetError

MAX_NAME_BYTES = 0xFFFF
MAX_QUEUE_ID = 0xFFFF_FFFF
MAX_OFFSET = (1 << 63) - 1


def check_offset(group: object, topic: object, queue_id: object, offset: object) -> None:
    """Raise InvalidOffsetError (naming the entry) unless every store can keep this offset exactly.

    Every committed offset passes here twice (the broker's request check and the store's), a
    consumer of 1000 queues commits 1000 at a time, so the error's text is made only for an error."""
    for what, name in (("group", group), ("topic", topic)):
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME_BYTES:
            raise _invalid(group, topic, queue_id, offset, f"the {what} must be 1..{MAX_NAME_BYTES} bytes of UTF-8")
    if not _is_int(queue_id) or not 0 <= queue_id <= MAX_QUEUE_ID:  # type: ignore[operator]
        raise _invalid(group, topic, queue_id, offset, f"the queue id must be 0..{MAX_QUEUE_ID}")
    if not _is_int(offset) or not 0 <= offset <= MAX_OFFSET:  # type: ignore[operator]
        raise _invalid(group, topic, queue_id, offset, "the offset must be 0..2**63-1")


def _invalid(group: object, topic: object, queue_id: object, offset: object, why: str) -> InvalidOffsetError:
    return InvalidOffsetError(f"offset [{group!r:.40}, {topic!r:.40}, {queue_id!r}, {offset!r}]: {why}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
