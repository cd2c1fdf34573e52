"""One background asyncio loop per process for the blocking clients.

Blocking Producer/Consumer/AdminClient objects run their async counterparts on this loop, so
sync code gets the same batching and long polling without managing a loop itself.

The loop thread shares the GIL with the application's threads. A thread that wants the GIL waits
up to the interpreter's switch interval (5 ms by default) for a busy thread to hand it over, and
the loop thread wants it several times per message (each wake-up from epoll). So an application
thread that computes between sends would hold every delivery back by 5 ms steps. Starting the
loop lowers the switch interval to `EQUEUE_SWITCH_INTERVAL_MS` (0.5 ms by default; never raised,
`0` leaves the interpreter's alone). It is a process-wide setting: it makes busy threads trade the
GIL ten times as often, which costs CPU-bound multi-threaded code little.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sys
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


DEFAULT_SWITCH_INTERVAL_MS = 0.5


def lower_switch_interval() -> float:
    """Apply EQUEUE_SWITCH_INTERVAL_MS (see the module docstring); returns the interval now set."""
    raw = os.environ.get("EQUEUE_SWITCH_INTERVAL_MS", "").strip()
    try:
        ms = float(raw) if raw else DEFAULT_SWITCH_INTERVAL_MS
    except ValueError:
        logging.getLogger("equeue.client").warning(
            "EQUEUE_SWITCH_INTERVAL_MS=%r is not a number; using %s", raw, DEFAULT_SWITCH_INTERVAL_MS)
        ms = DEFAULT_SWITCH_INTERVAL_MS
    if ms > 0 and ms / 1000 < sys.getswitchinterval():
        sys.setswitchinterval(ms / 1000)
    return sys.getswitchinterval()


def background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            lower_switch_interval()
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
