"""Per topic and consumer group: messages in, consumed, lag and recent throughput.

Everything the report needs is in the store's metadata (queue ranges, committed group offsets, the
store-time index behind offset_for_timestamp), so it reads no message bodies and needs no Spark
cluster: it is exact and takes milliseconds even for huge topics. Definitions, summed over a topic's
queues (committed offsets clamped into [min, max]):

    messages_in  = max - min              messages the store holds
    consumed     = committed - min        of those, already committed by the group
    lag          = max - committed        still to consume
    msgs_per_min = (max - offset_for_timestamp(now - window)) / window minutes   (arrivals)

A topic no group has committed to is listed once with group "" (consumed 0, lag = messages_in).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from equeue_spark.common import StoreLocation, store_location

COLUMNS = ("topic", "group", "queues", "messages_in", "consumed", "lag", "msgs_per_min")


def collect(data_dir: str, store: str | None = None, window_minutes: float = 5.0,
            now_ms: int | None = None, topics: list[str] | None = None) -> list[dict[str, Any]]:
    """The report rows, sorted by topic then group."""
    options = {"path": data_dir}
    if store:
        options["store"] = store
    location: StoreLocation = store_location(options)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    window_ms = max(1, int(window_minutes * 60_000))
    reader = location.open()
    try:
        all_queues = reader.queues()
        committed = reader.group_offsets()
        rows = []
        for topic in sorted(all_queues):
            if topics and topic not in topics:
                continue
            ranges = {q: tuple(reader.queue_range(topic, q)) for q in sorted(all_queues[topic])}
            messages_in = sum(hi - lo for lo, hi in ranges.values())
            recent = sum(hi - max(lo, min(hi, reader.offset_for_timestamp(topic, q, now_ms - window_ms)))
                         for q, (lo, hi) in ranges.items())
            rate = round(recent / (window_ms / 60_000), 3)
            groups = sorted({g for (g, t, _q) in committed if t == topic})
            for group in groups or [""]:
                consumed = 0
                for q, (lo, hi) in ranges.items():
                    c = committed.get((group, topic, q), lo) if group else lo
                    consumed += max(lo, min(hi, int(c))) - lo
                rows.append({"topic": topic, "group": group, "queues": len(ranges),
                             "messages_in": messages_in, "consumed": consumed,
                             "lag": messages_in - consumed, "msgs_per_min": rate})
        return rows
    finally:
        reader.close()


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table (numbers right-aligned)."""
    cells = [list(COLUMNS)] + [[f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in COLUMNS]
                               for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(cells):
        parts = [v.ljust(w) if COLUMNS[i] in ("topic", "group") else v.rjust(w)
                 for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_rows(rows: list[dict[str, Any]], out: str) -> None:
    """Write the rows to out: Parquet for .parquet, CSV for .csv (pyarrow, no Spark needed)."""
    import pyarrow as pa

    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("topic", pa.string()), ("group", pa.string()), ("queues", pa.int32()),
        ("messages_in", pa.int64()), ("consumed", pa.int64()), ("lag", pa.int64()),
        ("msgs_per_min", pa.float64())]))
    ext = os.path.splitext(out)[1].lower()
    if ext == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    elif ext == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, out)
    else:
        raise ValueError(f"--out must end in .parquet or .csv, got {out!r}")


def run(data_dir: str, store: str | None = None, out: str | None = None, window_minutes: float = 5.0,
        now_ms: int | None = None, topics: list[str] | None = None,
        stream: TextIO | None = None) -> list[dict[str, Any]]:
    """Collect the report, print it as a table, and write it to `out` when given; returns the rows."""
    rows = collect(data_dir, store, window_minutes, now_ms, topics)
    print(format_table(rows), file=stream or sys.stdout)
    if out:
        write_rows(rows, out)
    return rows
