"""One background asyncio loop per process for the blocking clients.

Blocking Producer/Consumer/AdminClient objects run their async counterparts on this loop, so
sync code gets the same batching and long polling without managing a loop itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


def background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = _new_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="equeue-client-loop", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
    """Run a coroutine on the background loop and wait for its result from this thread."""
    loop = background_loop()
    try:
        if asyncio.get_running_loop() is loop:
            raise RuntimeError("blocking client call made from its own event loop; use the async client")
    except RuntimeError as e:
        if "blocking client call" in str(e):
            coro.close()
            raise
    fut: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(coro, loop)
    return fut.result(timeout)
