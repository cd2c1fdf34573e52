"""bench/thread_cpu.py: a process's time by thread kind, from the scheduler's own counters.

Each thread here burns a fixed amount of its own CPU (time.thread_time, so the amount does not
depend on how fast or loaded the machine is), and ThreadCpu must put at least that much under
the thread's kind and none under a kind that did not run. Nothing here asserts a wall-clock time.
"""

from __future__ import annotations

import threading
import time

from bench.thread_cpu import ThreadCpu, thread_cpu_s, thread_kind
from equeue_core.client.loop import LOOP_THREAD_NAME

BURN_S = 0.03


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_kinds_by_thread_name():
    assert thread_kind(LOOP_THREAD_NAME) == "loop"
    assert thread_kind("MainThread") == "caller"
    assert thread_kind("equeue-drain-batch-3") == "handlers"
    assert thread_kind("equeue-drain") == "other" and thread_kind("") == "other"


def test_each_thread_s_cpu_lands_under_its_kind():
    spans = ThreadCpu()
    worker = threading.Thread(target=burn, args=(BURN_S,), name="equeue-g-batch-0")
    worker.start()
    worker.join()  # ended: its counters are gone, so it must be read while alive
    burn(BURN_S)
    gone = spans.stop()
    # counted from construction on, not since the thread began (this process ran before it)
    assert BURN_S * 1e3 * 0.95 <= gone["cpu"].get("caller", 0) < BURN_S * 1e3 + 300, gone
    assert "handlers" not in gone["cpu"], gone

    spans = ThreadCpu()
    release = threading.Event()

    def burn_then_wait() -> None:
        burn(BURN_S)
        release.wait(10)

    worker = threading.Thread(target=burn_then_wait, name="equeue-g-batch-1")
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while thread_cpu_s("equeue-g-batch-1") < BURN_S and time.monotonic() < deadline:
            time.sleep(0.005)
        seen = spans.stop()
    finally:
        release.set()
        worker.join()
    assert seen["cpu"]["handlers"] >= BURN_S * 1e3 * 0.95, seen
    assert set(seen) == {"cpu", "runq"}
    assert all(ms >= 0.1 for part in seen.values() for ms in part.values()), seen
