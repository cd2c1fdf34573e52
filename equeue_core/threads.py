"""Work the broker hands to a worker thread so its event loop keeps serving.

`asyncio.to_thread` alone is not enough at shutdown: cancelling the awaiting task does not stop
the thread, so a persist or a retention round could still be writing while `Broker.stop` closes
the store under it. `run_to_end` keeps the thread's work and its awaiter together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_to_end(fn: Callable[..., T], *args: Any) -> T:
    """Run fn(*args) on a worker thread and return its result. If the caller is cancelled, wait
    for the thread to finish before re-raising, so nothing it touches is closed under it."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait({work})
        raise
