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

from tests.helpers.broker import create_topic

# registered before equeue is imported, so it runs after the client's own atexit handler
REPORT = ("import atexit, threading\n"
          "atexit.register(lambda: print('loop thread alive at exit:', any(t.name == 'equeue-client-loop' "
          "for t in threading.enumerate()), flush=True))\n")


def _exit_of(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", REPORT + code], capture_output=True, text=True, timeout=120)


def test_open_clients_at_exit_stop_the_loop_thread_first(file_broker):
    topic = create_topic(file_broker, "exit-open", 2)
    r = _exit_of(
        "import time\n"
        "from equeue_core.client import Consumer, Message, Producer\n"
        f"p = Producer({file_broker.address!r}).start()\n"
        f"p.send(Message({topic!r}, b'sent'))\n"
        f"c = Consumer('exit-g', {file_broker.address!r}, consume_from='first').subscribe({topic!r})\n"
        "got = []\n"
        "c.start(got.append)\n"
        "deadline = time.monotonic() + 30\n"
        "while not got and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('consumed', len(got), flush=True)\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["consumed 1", "loop thread alive at exit: False"], r.stdout
    assert r.stderr == ""


def test_a_task_that_will_not_end_does_not_hold_the_exit():
    r = _exit_of(
        "import asyncio\n"
        "from equeue_core.client.loop import background_loop\n"
        "async def stubborn():\n"
        "    while True:\n"
        "        try:\n"
        "            await asyncio.sleep(3600)\n"
        "        except asyncio.CancelledError:\n"
        "            pass\n"
        "asyncio.run_coroutine_threadsafe(stubborn(), background_loop())\n"
        "print('started', flush=True)\n")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["started", "loop thread alive at exit: False"], r.stdout
