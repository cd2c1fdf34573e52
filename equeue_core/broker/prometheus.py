"""The broker's Prometheus endpoint: BrokerMetrics.snapshot() rendered as metric families.

A custom collector, so nothing is kept up to date for Prometheus between scrapes: each scrape asks
the broker's event loop for one snapshot (the counters it already keeps, plus the gauges computed
then: lag, sizes, held pulls ...) and renders it. The HTTP server is prometheus-client's own, on a
thread, bound to `metrics_host:metrics_port` (127.0.0.1:10913 by default; port 0 = no endpoint).
Every name is described in docs/operations.md, "Metrics".
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from equeue_core.errors import ConfigError

SCRAPE_TIMEOUT_S = 10.0


def _histogram(name: str, doc: str, h: dict[str, Any]) -> HistogramMetricFamily:
    cumulative, buckets = 0, []
    for bound, count in zip(h["buckets"], h["counts"], strict=False):
        cumulative += count
        buckets.append((repr(float(bound)), cumulative))
    buckets.append(("+Inf", cumulative + h["counts"][-1]))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h["sum"])


def families(snap: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of one snapshot (names follow Prometheus conventions: base units,
    `_total` for counters, `_seconds`/`_bytes` suffixes)."""
    info = GaugeMetricFamily("equeue_broker_info", "Broker identity; the value is always 1.",
                             labels=["address", "store", "transport", "flush"])
    info.add_metric([snap["address"], snap["store"], snap["transport"], snap["flush"]], 1)
    yield info
    yield GaugeMetricFamily("equeue_broker_start_time_seconds", "When the broker started (Unix time).",
                            value=snap["started"])

    per_topic = (("messages_in", "equeue_messages_in", "Messages stored, per topic (sends, delayed and retried copies)."),
                 ("bytes_in", "equeue_bytes_in", "Bytes of records stored, per topic."),
                 ("messages_out", "equeue_messages_out", "Messages returned by pulls, per topic."),
                 ("bytes_out", "equeue_bytes_out", "Bytes of records returned by pulls, per topic."))
    for key, name, doc in per_topic:
        fam = CounterMetricFamily(name, doc, labels=["topic"])
        for topic, t in snap["topics"].items():
            fam.add_metric([topic], t[key])
        yield fam

    lat = snap["latency"]
    yield _histogram("equeue_send_latency_seconds",
                     "Send requests: arrival to reply, including the fsync wait in sync flush mode.", lat["send"])
    yield _histogram("equeue_pull_latency_seconds",
                     "Pull requests: arrival to reply, less the time parked waiting for messages.", lat["pull"])
    yield _histogram("equeue_flush_latency_seconds", "Flush rounds of the store (fsync or equivalent).",
                     lat["flush"])
    yield CounterMetricFamily("equeue_fsyncs", "Flush rounds that made written data durable (group commits).",
                              value=sum(lat["flush"]["counts"]))
    yield _histogram("equeue_gc_pause_seconds",
                     "Collections of the broker process's cyclic garbage collector (the loop waits for each).",
                     lat["gc"])

    yield GaugeMetricFamily("equeue_held_pulls", "Pull requests parked until a message arrives (long polling).",
                            value=snap["held_pulls"])
    busy = snap["busy_poll"]
    yield CounterMetricFamily("equeue_busy_poll_caught", "Requests that arrived while the event loop busy-polled "
                              "after the one before (busy_poll_us).", value=busy["caught"])
    yield CounterMetricFamily("equeue_busy_poll_missed", "Busy-polling windows that ran out with no request.",
                              value=busy["missed"])
    yield CounterMetricFamily("equeue_busy_poll_seconds", "Time the event loop spent busy-polling (at most the CPU "
                              "it cost: it yields the CPU every turn).", value=busy["spin_seconds"])
    if snap["connections"] is not None:
        yield GaugeMetricFamily("equeue_connections", "Open client connections.", value=snap["connections"])

    members = GaugeMetricFamily("equeue_consumer_group_members", "Consumers alive in a group.", labels=["group"])
    lag = GaugeMetricFamily("equeue_consumer_group_lag",
                            "Messages of a queue not yet consumed by a group (max offset - committed offset).",
                            labels=["group", "topic", "queue"])
    for group, g in snap["groups"].items():
        members.add_metric([group], g["members"])
        for topic, queue, n in g["queues"]:
            lag.add_metric([group, topic, str(queue)], n)
    yield members
    yield lag

    disk = snap["disk"]
    yield GaugeMetricFamily("equeue_store_size_bytes", "Bytes the data directory occupies on disk.",
                            value=disk["store_bytes"])
    yield GaugeMetricFamily("equeue_disk_free_bytes", "Free bytes on the data directory's file system.",
                            value=disk["disk_free_bytes"])
    yield GaugeMetricFamily("equeue_disk_size_bytes", "Size of the data directory's file system.",
                            value=disk["disk_total_bytes"])
    yield GaugeMetricFamily("equeue_scheduled_messages", "Delayed and retry messages waiting for their time.",
                            value=snap["scheduled"])
    yield CounterMetricFamily("equeue_retention_released_bytes",
                              "Bytes released by retention (age, consumption, disk high-water mark).",
                              value=snap["retention_released_bytes"])

    yield CounterMetricFamily("equeue_access_denied", "Requests the authorizer refused (docs/security.md).",
                              value=snap.get("access_denied", 0))

    rec = snap["recovery"]
    yield GaugeMetricFamily("equeue_recovery_clean", "1 if the last start found a clean shutdown, 0 after a crash.",
                            value=1 if rec["clean"] else 0)
    yield GaugeMetricFamily("equeue_recovery_truncated_bytes", "Bytes of torn records cut off at the last start.",
                            value=rec["truncated_bytes"])
    yield GaugeMetricFamily("equeue_recovery_rebuilt_entries", "Index entries rebuilt from the log at the last start.",
                            value=rec["rebuilt_entries"])
    yield GaugeMetricFamily("equeue_recovery_records", "Records recovery scanned at the last start.",
                            value=rec["records"])
    yield GaugeMetricFamily("equeue_recovery_duration_seconds", "How long opening the store took at the last start.",
                            value=rec["seconds"])


Render = Callable[[dict[str, Any]], Iterator[Metric]]


class SnapshotCollector:
    """A prometheus-client collector that renders a fresh snapshot at every scrape."""

    def __init__(self, read: Callable[[], dict[str, Any]], render: Render = families) -> None:
        self._read = read
        self._render = render

    def collect(self) -> Iterator[Metric]:
        yield from self._render(self._read())


class MetricsEndpoint:
    """The HTTP endpoint: GET /metrics in the Prometheus text format, served on its own thread.
    `render` turns one snapshot into metric families: the broker's by default, the name server
    passes its own (equeue_core/nameserver/metrics.py)."""

    def __init__(self, snapshot: Callable[[], Any], loop: asyncio.AbstractEventLoop,
                 render: Render = families) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SnapshotCollector(self._read, render))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, resident memory, fds
        self._snapshot = snapshot
        self._loop = loop
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    def _read(self) -> dict[str, Any]:
        # The snapshot reads live broker state, so it runs on the broker's loop; this thread waits.
        return asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop).result(SCRAPE_TIMEOUT_S)

    def start(self, host: str, port: int) -> tuple[str, int]:
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror}"
            raise ConfigError(f"metrics endpoint {host}:{port} {why} "
                              "(set metrics_port to another port, or 0 to turn metrics off)") from None
        self.address = self._server.server_address[:2]
        return self.address

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(5)
            self._server = None
