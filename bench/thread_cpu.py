"""This process's time by thread over a span of a benchmark's work: on a CPU, and waiting for one.

Why: a client process is bound by its GIL before it is bound by its cores. A push Consumer's loop
thread (pulls, answers, dispatch) and its handler threads take turns at one GIL, so what a drain
costs is their CPU summed, and which of them grows with the queue count says where the time went
(docs/benchmarks.md, "Where a many-queue drain's time goes"). Each thread's time on a CPU comes
from its scheduler's nanosecond counter (/proc/self/task/<tid>/schedstat), and so does its time
runnable but off a CPU (the cores were busy elsewhere). Threads are told apart by their Python
names (the client loop thread's LOOP_THREAD_NAME, a consumer's handler threads
`equeue-<group>-batch-<n>`).
"""

from __future__ import annotations

import os
import threading

from bench.peers.common import thread_cpu_seconds, thread_schedstat
from equeue_core.client.loop import LOOP_THREAD_NAME


def thread_kind(name: str) -> str:
    """`loop` (the client's background loop thread), `handlers` (a push Consumer's handler
    threads), `caller` (the main thread) or `other`."""
    if name == LOOP_THREAD_NAME:
        return "loop"
    if name == "MainThread":
        return "caller"
    if name.startswith("equeue-") and "-batch-" in name:
        return "handlers"
    return "other"


def thread_cpu_s(name: str) -> float:
    """The CPU time so far of this process's thread called `name`; 0.0 if there is none."""
    for t in threading.enumerate():
        if t.name == name and t.native_id is not None:
            return thread_cpu_seconds("self", t.native_id)
    return 0.0


class ThreadCpu:
    """Every thread's time from construction to stop(), summed by `thread_kind`: on a CPU, and
    runnable but waiting for one (schedstat's second counter: the machine's other processes, or
    this process's own threads, had the cores). A thread that started meanwhile counts from zero;
    one that ended meanwhile is not counted (its counters are gone from /proc with it)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> dict[int, tuple[int, int]]:
        counters = {}
        for tid in os.listdir("/proc/self/task"):
            read = thread_schedstat("self", tid)
            if read is not None:  # (None: ended meanwhile)
                counters[int(tid)] = read
        return counters

    def stop(self) -> dict[str, dict[str, float]]:
        """{"cpu": {kind: ms}, "runq": {kind: ms}}, only the kinds with at least 0.1 ms."""
        end = self._read()
        names = {t.native_id: t.name for t in threading.enumerate()}
        spent: dict[str, list[int]] = {}
        for tid, (on_cpu, waiting) in end.items():
            was_on, was_waiting = self._start.get(tid, (0, 0))
            kind = spent.setdefault(thread_kind(names.get(tid, "")), [0, 0])
            kind[0] += on_cpu - was_on
            kind[1] += waiting - was_waiting
        return {part: {kind: round(ns[i] / 1e6, 1) for kind, ns in sorted(spent.items()) if ns[i] >= 100_000}
                for i, part in enumerate(("cpu", "runq"))}
