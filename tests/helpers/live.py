"""How many messages of a topic exist as decoded objects in this process right now: what tests
of "a pulled answer stays bytes until handed out" count."""
from __future__ import annotations

import gc

from equeue_core.client.message import ReceivedMessage


def live_messages(topic: str) -> int:
    """ReceivedMessage objects of `topic` alive (only this topic: earlier tests in the same
    process may leave messages of theirs behind)."""
    return sum(1 for o in gc.get_objects() if type(o) is ReceivedMessage and o.topic == topic)
