"""The broker's operating figures, counted cheaply on the request path and read as one snapshot.

Two kinds of figure, kept apart on purpose:

- **Counted** as requests go by: messages and bytes in and out per topic (one dict update per
  stored or pulled *batch*, never per message), and latency histograms of send, pull and flush
  (one bisect per request or flush round), and of the process's GC pauses (one per collection).
  These are plain ints in plain dicts, touched only on the thread that owns them (the event loop;
  the flusher thread for flushes; for GC pauses whichever thread the collection ran in, one at a
  time).
- **Computed when read**: consumer-group lag per queue, held pulls, connections, store size and
  free disk, scheduler backlog, retention releases, recovery figures. Nothing on the hot path
  keeps them up to date; `snapshot()` reads them from the broker's state when someone asks.

`snapshot()` is the one source for both readers: the BROKER_STATS admin request (`equeue stats`,
the web console) and the Prometheus endpoint (equeue_core.broker.prometheus), so the terminal,
the console and Prometheus always agree. docs/operations.md describes every figure.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from equeue_core import flush
from equeue_core.allocator import malloc_settings
from equeue_core.codes import Code
from equeue_core.contracts import ServerConnection
from equeue_core.frame import Frame

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

# Upper bounds (seconds) of the latency buckets: 100 us .. 10 s, roughly 1-2.5-5 per decade.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LatencyHistogram:
    """A fixed-bucket histogram: counts[i] holds observations in (BUCKETS[i-1], BUCKETS[i]]; the
    last slot holds those above the last bound. One writer thread; readers may see a count a
    moment ahead of the sum, which a scrape tolerates."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> dict[str, Any]:
        return {"buckets": list(LATENCY_BUCKETS), "counts": list(self.counts), "sum": self.sum}


def observe_gc_pauses(observe: Callable[[float], None]) -> Callable[[], None]:
    """Time every collection of the cyclic GC in this process (gc.callbacks) and hand its pause, in
    seconds, to `observe`; returns the function that stops it. A collection holds the GIL, so the
    broker's loop waits for it: a request path that leaves reference cycles behind pays here (each
    held pull did once: docs/benchmarks.md, "The broker's cyclic garbage")."""
    started = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            observe(time.perf_counter() - started[0])

    gc.callbacks.append(timed)

    def stop() -> None:
        try:
            gc.callbacks.remove(timed)
        except ValueError:
            pass

    return stop


def dir_size(path: str) -> int:
    """Bytes the files under path occupy on disk (allocated blocks, so sparse files such as an
    LMDB map count what they really use)."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:  # retention removed it while we walked
                        continue
        except FileNotFoundError:
            continue
    return total


class BrokerMetrics:
    """Counters the broker bumps per batch, and the snapshot every reader shares."""

    def __init__(self, broker: Broker, recovery_seconds: float = 0.0) -> None:
        self.broker = broker
        self.started = time.time()
        self.recovery_seconds = recovery_seconds
        self.messages_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.messages_out: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.send_latency = LatencyHistogram()
        self.pull_latency = LatencyHistogram()
        self.flush_latency = LatencyHistogram()
        self.gc_pauses = LatencyHistogram()
        self._unobserve: Callable[[], None] | None = None
        self._unobserve_gc: Callable[[], None] | None = None
        self.endpoint: Any = None  # the Prometheus endpoint, when metrics_port is not 0

    def start(self, host: str, port: int) -> tuple[str, int] | None:
        """Time the store's flush rounds (every store flushes through equeue_core.flush) and, unless
        port is 0, serve /metrics on host:port. Returns the endpoint's address, or None."""
        self._unobserve = flush.observe_flushes(self.flush_latency.observe)
        self._unobserve_gc = observe_gc_pauses(self.gc_pauses.observe)
        if not port:
            return None
        from equeue_core.broker.prometheus import MetricsEndpoint

        self.endpoint = MetricsEndpoint(self.snapshot, asyncio.get_running_loop())
        return self.endpoint.start(host, port)

    async def stop(self) -> None:
        if self._unobserve is not None:
            self._unobserve()
            self._unobserve = None
        if self._unobserve_gc is not None:
            self._unobserve_gc()
            self._unobserve_gc = None
        if self.endpoint is not None:
            await asyncio.to_thread(self.endpoint.close)
            self.endpoint = None

    # ---------------------------------------------------------------- the hot path: per batch

    def stored(self, topic: str, messages: int, size: int) -> None:
        self.messages_in[topic] = self.messages_in.get(topic, 0) + messages
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + size

    def pulled(self, topic: str, messages: int, size: int, seconds: float) -> None:
        if messages:
            self.messages_out[topic] = self.messages_out.get(topic, 0) + messages
            self.bytes_out[topic] = self.bytes_out.get(topic, 0) + size
        self.pull_latency.observe(seconds)

    # ---------------------------------------------------------------- read when asked

    def group_lag(self) -> dict[str, dict[str, Any]]:
        """Per user group (system groups such as the scheduler's are left out): members and the
        lag of every queue it consumes. Runs on the event loop: reads live registries."""
        groups = self.broker.groups
        out: dict[str, dict[str, Any]] = {}
        for g in groups.group_names():
            if g.startswith("%"):
                continue
            out[g] = {"members": len(groups.groups.get(g, {})),
                      "queues": [[r["topic"], r["queue_id"], r["lag"]] for r in groups.progress(g)]}
        return out

    def live(self) -> dict[str, Any]:
        """Everything that must be read on the event loop (plain data, safe to hand to a thread)."""
        b = self.broker
        rec = b.recovery
        server = getattr(b, "_server", None)
        connections = getattr(server, "connections", None)
        topics = sorted(set(self.messages_in) | set(self.messages_out) | set(b.topics.topics))
        return {
            "time": time.time(),
            "started": self.started,
            "address": f"{b.address[0]}:{b.address[1]}",
            "store": b.config.store, "transport": b.config.transport, "flush": b.config.flush,
            "topics": {t: {"queues": b.topics.topics.get(t, 0),
                           "messages_in": self.messages_in.get(t, 0), "bytes_in": self.bytes_in.get(t, 0),
                           "messages_out": self.messages_out.get(t, 0), "bytes_out": self.bytes_out.get(t, 0)}
                       for t in topics},
            "groups": self.group_lag(),
            "held_pulls": b.hold.held,
            "gc_frozen_objects": gc.get_freeze_count(),
            "malloc": malloc_settings(),
            "busy_poll": b.busy_poll.snapshot(),
            "connections": None if connections is None else len(connections),
            "scheduled": b.scheduler.pending,
            "retention_released_bytes": b.retention.released,
            "access_denied": 0 if b.access is None else b.access.denied,
            "recovery": {"clean": rec.clean, "truncated_bytes": rec.truncated_bytes,
                         "rebuilt_entries": rec.rebuilt_entries, "records": rec.records,
                         "seconds": self.recovery_seconds},
            "latency": {"send": self.send_latency.snapshot(), "pull": self.pull_latency.snapshot(),
                        "flush": self.flush_latency.snapshot(), "gc": self.gc_pauses.snapshot()},
        }

    def disk(self) -> dict[str, int]:
        """Store size and free disk: file-system calls, so callers run it off the event loop."""
        data_dir = self.broker.config.data_dir
        usage = shutil.disk_usage(data_dir)
        return {"store_bytes": dir_size(data_dir), "disk_free_bytes": usage.free,
                "disk_total_bytes": usage.total}

    async def snapshot(self) -> dict[str, Any]:
        """The whole picture; call on the broker's event loop."""
        snap = self.live()
        snap["disk"] = await asyncio.to_thread(self.disk)
        return snap

    def handlers(self) -> dict:
        return {Code.BROKER_STATS: self.on_broker_stats}

    async def on_broker_stats(self, conn: ServerConnection, frame: Frame) -> Frame:
        return frame.response(await self.snapshot())
