"""Export a topic to Parquet, partitioned by date (of store time, UTC) and queue id, incrementally.

A small state file in the target directory (`_equeue_export_state.json`, hidden from Parquet readers
by its leading underscore) records the next offset to export per queue. Each run snapshots every
queue's end, exports [state, end) queue by queue, and advances the state after each queue's files
are written, so a second run exports only what arrived since, and a run that dies midway resumes at
the first queue it had not finished. Guarantee: no gap ever; a crash between a queue's Parquet
commit and its state update re-exports that queue's slice once (at-least-once across crashes).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from equeue_spark.common import StoreLocation, store_location, topic_queues
from equeue_spark.jobs.progress import Progress

STATE_FILE = "_equeue_export_state.json"


def load_state(to_dir: str) -> dict[str, Any]:
    """The export state of to_dir ({} if it was never exported to)."""
    try:
        with open(os.path.join(to_dir, STATE_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _save_state(to_dir: str, state: dict[str, Any]) -> None:
    """Write the state atomically (temp file, fsync, rename) so it is never half written."""
    fd, tmp = tempfile.mkstemp(prefix="_equeue_state.", dir=to_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(to_dir, STATE_FILE))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run(data_dir: str, topic: str, to_dir: str, store: str | None = None, progress: bool | None = None,
        spark: Any = None, queues: list[int] | None = None,
        max_offsets_per_partition: int | None = None) -> dict[str, Any]:
    """Export what is new in `topic` since the last run into `to_dir`; returns a summary.

    The summary holds the total rows written and, per queue, the [start, end) exported. `store`
    defaults to the one named in the data dir's broker.json (else "file"). `spark` is an existing
    session to use; without one, a local session is created (see equeue_spark.session).
    """
    from equeue_spark.session import get_session
    from pyspark.sql import functions as F

    options = {"path": data_dir, "topic": topic}
    if store:
        options["store"] = store
    location: StoreLocation = store_location(options)
    os.makedirs(to_dir, exist_ok=True)
    state = load_state(to_dir)
    if state and (state.get("topic") != topic):
        raise ValueError(f"{to_dir} holds an export of topic {state.get('topic')!r}, not {topic!r}")
    next_offsets: dict[str, int] = {str(k): int(v) for k, v in state.get("next", {}).items()}

    reader = location.open()
    try:
        plan = {}
        for q in topic_queues(reader, topic, queues):
            lo, hi = reader.queue_range(topic, q)
            start = max(lo, min(hi, next_offsets.get(str(q), lo)))
            plan[q] = (start, hi)
    finally:
        reader.close()

    spark = spark or get_session(app_name="equeue-export")
    bar = Progress(len(plan), f"export {topic}", progress)
    bar.draw(force=True)
    summary: dict[str, Any] = {"topic": topic, "to": to_dir, "rows": 0, "queues": {}}
    for q, (start, end) in plan.items():
        if end > start:
            reader_opts = {**options, "store": location.store, "queues": str(q),
                           "startingOffset": json.dumps({str(q): start}),
                           "endingOffset": json.dumps({str(q): end})}
            if max_offsets_per_partition:
                reader_opts["maxOffsetsPerPartition"] = str(max_offsets_per_partition)
            for k, v in location.reader_options:
                reader_opts["store." + k] = v
            df = spark.read.format("equeue").options(**reader_opts).load()
            (df.withColumn("date", F.date_format(F.col("store_ts"), "yyyy-MM-dd"))
               .write.mode("append").partitionBy("date", "queue_id").parquet(to_dir))
        next_offsets[str(q)] = end
        _save_state(to_dir, {"topic": topic, "store": location.store, "next": next_offsets})
        summary["queues"][q] = (start, end)
        summary["rows"] += end - start
        bar.advance(rows=end - start)
    bar.finish()
    return summary

