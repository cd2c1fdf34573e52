"""`equeue stats`: a live terminal view of a broker (rates per topic, lag per group, latency, disk),
or with `--nameserver` of every broker of a cluster (a row per broker, then each broker's view).

Fed by the admin client's BROKER_STATS request rather than by scraping the Prometheus endpoint:
it works over the same `--broker` address and transport as every other command (zmq included),
needs no second port (the endpoint is loopback-only by default and may be off), and one round trip
brings the whole snapshot, histograms included. It is the same snapshot the endpoint renders, so
the two never disagree. Rates are differences between two snapshots over their time apart.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from equeue_core.errors import EQueueError


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f}"  # pragma: no cover


def human_seconds(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def quantile(hist: dict[str, Any], prev: dict[str, Any] | None, q: float) -> str:
    """Upper bound of the bucket holding quantile q of the observations since prev (or ever)."""
    counts = hist["counts"]
    if prev is not None:
        counts = [a - b for a, b in zip(counts, prev["counts"], strict=True)]
    total = sum(counts)
    if not total:
        return "-"
    need, seen = q * total, 0
    for bound, c in zip([*hist["buckets"], None], counts, strict=True):
        seen += c
        if seen >= need:
            if bound is None:
                return f">{hist['buckets'][-1]:g}s"
            return f"≤{bound * 1000:g}ms" if bound < 1 else f"≤{bound:g}s"
    return "-"  # pragma: no cover


class StatsView:
    """Renders snapshots; remembers the previous one to turn counters into rates."""

    def __init__(self, system: bool = False) -> None:
        self.system = system
        self.prev: dict[str, Any] | None = None

    def render(self, snap: dict[str, Any]) -> Group:
        prev, self.prev = self.prev, snap
        dt = snap["time"] - prev["time"] if prev else 0.0

        def rate(topic: str, key: str) -> float | None:
            if not prev or dt <= 0:
                return None
            before = prev["topics"].get(topic, {}).get(key, 0)
            return (snap["topics"][topic][key] - before) / dt

        disk = snap["disk"]
        used = 1 - disk["disk_free_bytes"] / disk["disk_total_bytes"] if disk["disk_total_bytes"] else 0.0
        head = Text.assemble(
            time.strftime("%H:%M:%S  ", time.localtime(snap["time"])),
            ("broker ", "bold"), snap["address"], f"  {snap['store']}/{snap['transport']} flush={snap['flush']}",
            f"  up {human_seconds(snap['time'] - snap['started'])}",
            f"  connections {snap['connections'] if snap['connections'] is not None else '-'}",
            f"  held pulls {snap['held_pulls']}\n",
            ("store ", "bold"), human_bytes(disk["store_bytes"]),
            f"  disk free {human_bytes(disk['disk_free_bytes'])} ({100 * (1 - used):.0f}%)",
            f"  scheduled {snap['scheduled']}  retention released {human_bytes(snap['retention_released_bytes'])}")

        topics = Table(title="topics", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("topic", "queues", "in/s", "out/s", "in B/s", "out B/s", "stored", "delivered"):
            topics.add_column(col, justify="left" if col == "topic" else "right", no_wrap=True)
        for name, t in snap["topics"].items():
            if name.startswith("%") and not self.system:
                continue
            r_in, r_out = rate(name, "messages_in"), rate(name, "messages_out")
            b_in, b_out = rate(name, "bytes_in"), rate(name, "bytes_out")
            topics.add_row(name, str(t["queues"]),
                           "-" if r_in is None else f"{r_in:,.0f}", "-" if r_out is None else f"{r_out:,.0f}",
                           "-" if b_in is None else human_bytes(b_in), "-" if b_out is None else human_bytes(b_out),
                           f"{t['messages_in']:,}", f"{t['messages_out']:,}")

        groups = Table(title="consumer groups", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("group", "members", "lag", "lag/s", "lag by queue"):
            groups.add_column(col, justify="left" if col in ("group", "lag by queue") else "right",
                              no_wrap=col != "lag by queue")
        for name, g in snap["groups"].items():
            lag = sum(n for _, _, n in g["queues"])
            change = "-"
            if prev and dt > 0 and name in prev["groups"]:
                change = f"{(lag - sum(n for _, _, n in prev['groups'][name]['queues'])) / dt:+,.0f}"
            by_queue = " ".join(f"{t}/{q}:{n:,}" for t, q, n in g["queues"] if n)
            groups.add_row(name, str(g["members"]), f"{lag:,}", change,
                           by_queue if len(by_queue) < 80 else by_queue[:77] + "...")

        latency = Table(title="latency since the last refresh", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("request", "per s", "p50", "p99"):
            latency.add_column(col, justify="left" if col == "request" else "right", no_wrap=True)
        for kind in ("send", "pull", "flush", "gc"):
            h = snap["latency"].get(kind)  # (a broker older than the gc figure has none)
            if h is None:
                continue
            p = prev["latency"].get(kind) if prev else None
            n = sum(h["counts"]) - (sum(p["counts"]) if p else 0)
            latency.add_row(kind, f"{n / dt:,.0f}" if dt > 0 else "-", quantile(h, p, 0.5), quantile(h, p, 0.99))
        return Group(head, topics, groups, latency)


def _totals(snap: dict[str, Any]) -> tuple[float, int, int]:
    return (snap["time"], sum(t["messages_in"] for t in snap["topics"].values()),
            sum(t["messages_out"] for t in snap["topics"].values()))


class ClusterStatsView:
    """`--nameserver`: a row per broker (messages in/out per second over every topic, lag, store),
    then each broker's own view (one StatsView per broker name, so its rates are its own)."""

    def __init__(self, system: bool = False) -> None:
        self.system = system
        self.views: dict[str, StatsView] = {}

    def render(self, snaps: dict[str, Any]) -> Group:
        brokers = Table(title="brokers", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("broker", "address", "in/s", "out/s", "stored", "lag", "connections", "store size"):
            brokers.add_column(col, justify="left" if col in ("broker", "address") else "right", no_wrap=True)
        parts: list[Any] = [brokers]
        for name, snap in sorted(snaps.items()):
            if isinstance(snap, BaseException):
                brokers.add_row(name, f"[red]{snap}[/red]", "-", "-", "-", "-", "-", "-")
                continue
            view = self.views.setdefault(name, StatsView(self.system))
            r_in = r_out = "-"
            if view.prev is not None:
                (t0, i0, o0), (t1, i1, o1) = _totals(view.prev), _totals(snap)
                if t1 > t0:
                    r_in, r_out = f"{(i1 - i0) / (t1 - t0):,.0f}", f"{(o1 - o0) / (t1 - t0):,.0f}"
            lag = sum(n for g in snap["groups"].values() for _, _, n in g["queues"])
            brokers.add_row(name, snap["address"], r_in, r_out, f"{_totals(snap)[1]:,}", f"{lag:,}",
                            "-" if snap["connections"] is None else str(snap["connections"]),
                            human_bytes(snap["disk"]["store_bytes"]))
            parts += [Text(f"\n── broker {name} ──", style="bold"), view.render(snap)]
        return Group(*parts)


def run_stats(broker: str, interval: float, once: bool, system: bool, console: Console | None = None,
              nameserver: str | None = None) -> int:
    """Refresh the view every `interval` seconds until Ctrl-C (or print one view with `once`,
    rates measured over one interval). A broker that stops answering is shown, and retried.
    With `nameserver`, every broker of the cluster (AdminClient(nameserver=...).stats())."""
    from equeue_core.client import AdminClient

    console = console or Console()
    view: StatsView | ClusterStatsView = ClusterStatsView(system) if nameserver else StatsView(system)
    target = f"name servers {nameserver}" if nameserver else f"broker {broker}"

    def connect() -> AdminClient:
        return AdminClient(nameserver=nameserver) if nameserver else AdminClient(broker)

    admin: AdminClient | None = connect()

    def read() -> Any:
        nonlocal admin
        try:
            if admin is None:
                admin = connect()
            return view.render(admin.stats())
        except (EQueueError, OSError) as e:
            if admin is not None:
                try:
                    admin.close()
                except (EQueueError, OSError):
                    pass
            admin = None
            return Text(f"{target}: {e} (retrying every {interval:g}s)", style="bold red")

    try:
        first = read()
        if once or not console.is_terminal:
            time.sleep(interval)
            console.print(read())
            return 0
        with Live(first, console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(read(), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        if admin is not None:
            admin.close()
