"""A process that exits with clients still open: the client's loop thread is stopped before the
interpreter is torn down (equeue_core/client/loop.py, `_stop_at_exit`). A uvloop loop left
running in a daemon thread can call into a half-finalized interpreter and die of SIGSEGV after its
work is done; once seen in a benchmark sender. What must hold: the loop thread is gone by the time
atexit handlers registered before the client's run, the open clients' tasks end cancelled (no
"Task was destroyed but it is pending!" on stderr), the exit code is 0, and a task that refuses
to be cancelled cannot hold the exit forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers.broker import create_topic

# registered before equeue is imported, so it runs after the client's own atexit handler
REPORT = """
import atexit, threading
atexit.register(lambda: print("loop thread alive at exit:",
                              any(t.name == "equeue-client-loop" for t in threading.enumerate()), flush=True))
"""


def _exit_of(code: str, said: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter that exits with whatever it left open: exit code 0, its
    last line `said`, and the loop thread gone when the report runs."""
    r = subprocess.run([sys.executable, "-c", REPORT + textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == [said, "loop thread alive at exit: False"], r.stdout
    return r


def test_open_clients_at_exit_stop_the_loop_thread_first(file_broker):
    topic = create_topic(file_broker, "exit-open", 2)
    r = _exit_of(f"""
        import time
        from equeue_core.client import Consumer, Message, Producer
        p = Producer({file_broker.address!r}).start()
        p.send(Message({topic!r}, b"sent"))
        c = Consumer("exit-g", {file_broker.address!r}, consume_from="first").subscribe({topic!r})
        got = []
        c.start(got.append)
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        print("consumed", len(got), flush=True)
        """, said="consumed 1")
    assert r.stderr == ""


def test_a_task_that_will_not_end_does_not_hold_the_exit():
    _exit_of("""
        import asyncio
        from equeue_core.client.loop import background_loop

        async def stubborn():
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    pass

        asyncio.run_coroutine_threadsafe(stubborn(), background_loop())
        print("started", flush=True)
        """, said="started")
