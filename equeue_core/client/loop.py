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

At interpreter exit (atexit) the loop's tasks are cancelled, as asyncio.run does at its end, then
the loop is stopped and closed in its own thread, and the exit waits for that thread (each step at
most EXIT_JOIN_S). A uvloop loop left running in a daemon thread can run a libuv callback while
the interpreter is being torn down; uvloop then asks for a thread state that no longer exists and
the process dies of SIGSEGV in PyThreadState_New, after all its work is done (seen once in a
benchmark sender; the same crash is reported against other daemon-thread uvloop users). Clients
still open at exit are dropped as before, without a flush: close them (or use `with`) to send
what `send_async` still holds.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
LOOP_THREAD_NAME = "equeue-client-loop"  # the background loop's thread (profilers and benchmarks find it by it)
EXIT_JOIN_S = 5.0  # how long the exit waits for the loop thread to stop (see the module docstring)


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
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            lower_switch_interval()
            loop = _new_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                finally:  # stopped at exit: close while the interpreter is whole
                    loop.close()

            thread = threading.Thread(target=run, name=LOOP_THREAD_NAME, daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread = loop, thread
        return _loop


@atexit.register
def _stop_at_exit() -> None:
    """Stop the background loop and wait for its thread (see the module docstring)."""
    with _lock:
        loop, thread = _loop, _thread
    if loop is None or thread is None or not thread.is_alive():
        return  # no loop, or not running in this process (a fork's child has no loop thread)
    try:
        cancelled = asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop)
    except RuntimeError:  # already closed
        return
    try:
        cancelled.result(EXIT_JOIN_S)
    except (concurrent.futures.TimeoutError, asyncio.CancelledError):
        pass  # a task that will not end: stop the loop under it
    loop.call_soon_threadsafe(loop.stop)
    thread.join(EXIT_JOIN_S)


async def _cancel_tasks() -> None:
    """Cancel every other task of the loop and wait for them, as asyncio.run does at its end, so
    clients still open at exit end their tasks instead of being destroyed pending."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


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
