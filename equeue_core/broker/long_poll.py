"""PullHold: pulls that found nothing wait here until their queue gets a message or time runs out.

Arrival wakes the held pulls of that queue at once; nothing polls.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


class PullHold:
    def __init__(self) -> None:
        self._waiting: dict[tuple[str, int], set[asyncio.Future]] = defaultdict(set)

    async def wait(self, topic: str, queue_id: int, timeout: float) -> bool:
        """True if woken by an arrival, False on timeout. The held pull awaits its future
        directly (a timer resolves it with False): an arrival resumes it on the loop's next
        turn, one turn sooner than through asyncio.wait_for's extra waiter."""
        key = (topic, queue_id)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiting[key].add(fut)
        timer = loop.call_later(timeout, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiting[key]

    def notify(self, topic: str, queue_id: int) -> None:
        waiters = self._waiting.pop((topic, queue_id), None)
        if waiters:
            for fut in waiters:
                _resolve(fut, True)

    def queues(self) -> list[tuple[str, int]]:
        """The (topic, queue id) pairs pulls are held on now."""
        return list(self._waiting)

    def wake_all(self) -> None:
        for key in list(self._waiting):
            self.notify(*key)

    @property
    def held(self) -> int:
        return sum(len(w) for w in self._waiting.values())


def _resolve(fut: asyncio.Future, woken: bool) -> None:
    if not fut.done():
        fut.set_result(woken)
