"""The `equeue` PySpark Python Data Source: batch and streaming reads of a stored topic, and writes
of a DataFrame to a topic through a producer.

Reads go through the store plugin's StoreReader (another process's read-only view of the broker's
data directory), so they work while the broker runs and see, per queue, a consistent prefix: the
planner fixes each queue's end offset from `queue_range` (the reader's safe end) and executors never
read past it. Rows travel as Arrow RecordBatches straight from `export()`.

Writes go through `equeue_core.client.Producer` to a running broker: at least once (a retried Spark
task sends its rows again), in per-task order.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from equeue_spark.common import (
    COLUMNS,
    DEFAULT_BATCH_ROWS,
    DEFAULT_MAX_OFFSETS_PER_PARTITION,
    EQueueSparkError,
    StoreLocation,
    columns_option,
    export_slices,
    int_opt,
    opt,
    parse_offset_spec,
    parse_queue_ids,
    parse_ts,
    requested_columns,
    resolve_bound,
    spark_schema,
    store_location,
    topic_queues,
)
from equeue_spark.pushdown import Pushdown, push_filters
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType


@dataclass
class EQueuePartition(InputPartition):
    """One Spark task: offset slices (queue id, start, end) of one topic, read one after the other
    (each queue's rows in offset order)."""

    topic: str
    slices: tuple[tuple[int, int, int], ...]


def _required_topic(options: Any) -> str:
    topic = opt(options, "topic")
    if not topic:
        raise EQueueSparkError('option "topic" is required')
    return topic


MIN_SLICE = 32768  # offsets: below this a partition costs more to schedule than to read


def _plan(topic: str, bounds: dict[int, tuple[int, int]], slice_size: int,
          min_partitions: int = 1) -> list[EQueuePartition]:
    """As few partitions as the read allows: ceil(offsets / slice_size), raised towards
    min_partitions (so every core gets a share) while each keeps at least MIN_SLICE offsets.

    The selected offsets of all queues, in queue order, are cut into that many runs of equal
    length, so several short queues share one partition and a long queue is cut across several.
    A task costs Spark ~0.1-0.2 s of CPU whatever it reads (a Python worker round trip, an Arrow
    stream), so one task per queue made a query on a topic of many short queues pay mostly for
    tasks. No partition holds more than slice_size offsets."""
    total = sum(max(0, e - s) for s, e in bounds.values())
    if not total:
        return []
    count = -(-total // slice_size)
    if min_partitions > count:
        count = max(count, min(min_partitions, -(-total // MIN_SLICE)))
    share = -(-total // count)
    parts: list[EQueuePartition] = []
    current: list[tuple[int, int, int]] = []
    room = share
    for q in sorted(bounds):
        start, end = bounds[q]
        while start < end:
            take = min(end - start, room)
            current.append((q, start, start + take))
            start += take
            room -= take
            if room == 0:
                parts.append(EQueuePartition(topic, tuple(current)))
                current, room = [], share
    if current:
        parts.append(EQueuePartition(topic, tuple(current)))
    return parts


PUSHDOWN_PLANNER = "pyspark.sql.worker.data_source_pushdown_filters"
"""pyspark's filter-pushdown planner module: the JVM runs it (by this name) in its own Python
worker only when spark.sql.python.filterPushdown.enabled is true."""


def in_pushdown_planner() -> bool:
    """True in the Python worker process that runs pyspark's filter-pushdown planner.

    pyspark (4.1-4.3) refuses to plan a read with a reader that overrides pushFilters unless the
    session sets spark.sql.python.filterPushdown.enabled=true, and runs its pushdown planner only
    when it is set. So the source hands out its pushdown reader only there: sessions with the
    setting get pushdown, sessions without it read exactly as before instead of failing.

    The planner is recognised by its process, not by the call stack: the worker daemon that forks
    it imported the planner module by name, and a worker started without the daemon runs it as
    __main__ (`python -m ...`). Planners of other kinds run in other processes, which never import
    it. So any depth of wrappers around reader() (a subclass, a decorator) sees the same answer."""
    if PUSHDOWN_PLANNER in sys.modules:
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == PUSHDOWN_PLANNER


class EQueueDataSource(DataSource):
    """`spark.read.format("equeue")` / `df.write.format("equeue")`.

    Options are documented in docs/spark.md. Only options travel to the workers (this object is
    pickled), so every setting is a string option resolved where it is used.
    """

    @classmethod
    def name(cls) -> str:
        return "equeue"

    def schema(self) -> StructType:
        """All columns, or only those of the `columns` option (a read builds only those)."""
        full = spark_schema()
        cols = columns_option(self.options)
        if cols is None:
            return full
        by_name = {f.name: f for f in full.fields}
        return StructType([by_name[c] for c in cols])

    def reader(self, schema: StructType) -> DataSourceReader:
        if in_pushdown_planner():
            return EQueuePushdownReader(dict(self.options), schema)
        return EQueueBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return EQueueStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> EQueueWriter:
        return EQueueWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> EQueueStreamWriter:
        return EQueueStreamWriter(dict(self.options), schema)


# ---------------------------------------------------------------- batch read


class EQueueBatchReader(DataSourceReader):
    """Plans (on the driver) the offset slices of the selected queues and reads them (on executors).

    The end of each queue is fixed when partitions() runs, so the DataFrame is one snapshot even if
    the broker keeps appending; re-running the action replans and sees the newer end. Only the
    columns of the schema Spark asks for are built (all of them, unless the `columns` option or a
    user-given schema narrows it).
    """

    def __init__(self, options: dict[str, str], schema: StructType | None = None) -> None:
        self.options = options
        self.topic = _required_topic(options)
        self.location: StoreLocation = store_location(options)
        self.queue_ids = parse_queue_ids(opt(options, "queues"))
        self.starting = parse_offset_spec(opt(options, "startingOffset"), "startingOffset")
        self.ending = parse_offset_spec(opt(options, "endingOffset"), "endingOffset")
        self.starting_ts = parse_ts(opt(options, "startingTimestamp"), "startingTimestamp")
        self.ending_ts = parse_ts(opt(options, "endingTimestamp"), "endingTimestamp")
        self.slice_size = int_opt(options, "maxOffsetsPerPartition", DEFAULT_MAX_OFFSETS_PER_PARTITION)
        self.min_partitions = int_opt(options, "minPartitions", os.cpu_count() or 1)
        self.batch_rows = int_opt(options, "batchRows", DEFAULT_BATCH_ROWS)
        self.columns = COLUMNS if schema is None else requested_columns(schema)
        self.pushed = Pushdown()

    def bounds(self) -> dict[int, tuple[int, int]]:
        """{queue: (start, end)} after options and pushed filters, clamped to what the store
        holds right now; queues the filters exclude are left out."""
        pushed = self.pushed
        if pushed.nothing:
            return {}
        rows = pushed.rows
        reader = self.location.open()
        try:
            out = {}
            for q in topic_queues(reader, self.topic, self.queue_ids):
                if not pushed.keeps_queue(q):
                    continue
                lo, hi = reader.queue_range(self.topic, q)
                start = resolve_bound(self.starting, self.starting_ts, reader, self.topic, q, lo, hi, lo)
                end = resolve_bound(self.ending, self.ending_ts, reader, self.topic, q, lo, hi, hi)
                start, end = pushed.offset_bounds(start, end)
                if end > start and rows.store_ts_min is not None:
                    start = max(start, reader.offset_for_timestamp(self.topic, q, rows.store_ts_min))
                if end > start and rows.store_ts_max is not None:
                    end = min(end, reader.offset_for_timestamp(self.topic, q, rows.store_ts_max + 1))
                out[q] = (start, max(start, end))
            return out
        finally:
            reader.close()

    def partitions(self) -> Sequence[InputPartition]:
        return _plan(self.topic, self.bounds(), self.slice_size, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, EQueuePartition):
            return iter(())  # nothing planned: pyspark runs one InputPartition(None)
        return export_slices(self.location, partition.topic, partition.slices, self.batch_rows,
                             self.columns, self.pushed.rows)


class EQueuePushdownReader(EQueueBatchReader):
    """The batch reader with filter pushdown (spark/pushdown.py): filters on topic, queue_id,
    queue_offset, tag and store_ts prune partitions and rows; the rest are left to Spark."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.pushed, rest = push_filters(filters, self.topic)
        return rest


# ---------------------------------------------------------------- streaming read


class EQueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over {queue id (string): next offset}.

    Offsets are the queue offsets themselves, so a query restarted from its checkpoint resumes at
    exactly the next message of every queue (no duplicate, no gap), while the store retains it. A
    queue that appears later starts at its first retained offset. Offsets below what retention
    kept are moved up to the queue's minimum (those messages are gone).
    """

    def __init__(self, options: dict[str, str], schema: StructType | None = None) -> None:
        self.options = options
        self.topic = _required_topic(options)
        self.location: StoreLocation = store_location(options)
        self.columns = COLUMNS if schema is None else requested_columns(schema)
        self.queue_ids = parse_queue_ids(opt(options, "queues"))
        self.starting = parse_offset_spec(opt(options, "startingOffsets"), "startingOffsets") or "earliest"
        self.slice_size = int_opt(options, "maxOffsetsPerPartition", DEFAULT_MAX_OFFSETS_PER_PARTITION)
        self.min_partitions = int_opt(options, "minPartitions", os.cpu_count() or 1)
        self.batch_rows = int_opt(options, "batchRows", DEFAULT_BATCH_ROWS)
        raw_max = opt(options, "maxMessagesPerTrigger")
        self.max_per_trigger = int_opt(options, "maxMessagesPerTrigger", 1) if raw_max else None
        self.target: dict[str, int] | None = None  # availableNow: the end fixed at query start

    def _ranges(self) -> dict[int, tuple[int, int]]:
        # A fresh reader per call: the contract does not promise an open reader sees later appends.
        reader = self.location.open()
        try:
            return {q: tuple(reader.queue_range(self.topic, q))  # type: ignore[misc]
                    for q in topic_queues(reader, self.topic, self.queue_ids)}
        finally:
            reader.close()

    def initialOffset(self) -> dict:
        ranges = self._ranges()
        out = {}
        for q, (lo, hi) in ranges.items():
            if self.starting == "latest":
                out[str(q)] = hi
            elif isinstance(self.starting, dict):
                out[str(q)] = max(lo, min(hi, self.starting.get(q, lo)))
            elif isinstance(self.starting, int):
                out[str(q)] = max(lo, min(hi, self.starting))
            else:
                out[str(q)] = lo
        return out

    def _available(self) -> dict[str, int]:
        return {str(q): hi for q, (_lo, hi) in self._ranges().items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._available()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return self._available()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch: everything available (or up to the availableNow
        target), capped by ReadMaxRows spread fairly over the queues that have data."""
        latest = self.target if self.target is not None else self._available()
        begin = {q: int(o) for q, o in start.items()}
        new_queues = [q for q in latest if q not in begin]
        if new_queues:  # a queue that appeared since start is read from its first retained offset
            ranges = self._ranges()
            for q in new_queues:
                begin[q] = ranges[int(q)][0] if int(q) in ranges else latest[q]
        end = {q: max(o, int(latest.get(q, o))) for q, o in begin.items()}
        if isinstance(limit, ReadMaxRows):
            end = self._cap(begin, end, int(limit.max_rows))
        return end

    @staticmethod
    def _cap(start: dict, end: dict[str, int], budget: int) -> dict[str, int]:
        """Give each queue with data an equal share of budget (leftover to the others)."""
        pending = {q: end[q] - int(start.get(q, end[q])) for q in end}
        pending = {q: n for q, n in pending.items() if n > 0}
        take = dict.fromkeys(pending, 0)
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            for q in sorted(pending, key=int):
                n = min(share, pending[q], budget)
                take[q] += n
                pending[q] -= n
                budget -= n
                if budget == 0:
                    break
            pending = {q: n for q, n in pending.items() if n > 0}
        capped = dict(end)
        for q in end:
            s = int(start.get(q, end[q]))
            capped[q] = s + take.get(q, 0) if end[q] > s else end[q]
        return capped

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = None
        bounds: dict[int, tuple[int, int]] = {}
        for q, e in end.items():
            if q in start:
                s = int(start[q])
            else:
                ranges = ranges or self._ranges()
                s = ranges[int(q)][0]
            if int(e) > s:
                bounds[int(q)] = (s, int(e))
        if bounds:
            # retention may have removed the head of a queue since the checkpoint
            ranges = ranges or self._ranges()
            bounds = {q: (max(s, ranges[q][0]) if q in ranges else s, e) for q, (s, e) in bounds.items()}
            bounds = {q: (s, e) for q, (s, e) in bounds.items() if e > s}
        return _plan(self.topic, bounds, self.slice_size, self.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, EQueuePartition)
        yield from export_slices(self.location, partition.topic, partition.slices, self.batch_rows,
                                 self.columns)

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, not in the broker."""

    def stop(self) -> None:
        """No resource is held between calls (each call opens and closes its reader)."""


# ---------------------------------------------------------------- write


@dataclass
class EQueueCommitMessage(WriterCommitMessage):
    """What one write task sent."""

    sent: int


def _broker_address(options: dict[str, str]) -> str:
    broker = opt(options, "broker")
    if broker:
        return broker
    path = opt(options, "path")
    if path:
        from equeue_core.export import read_broker_info

        info = read_broker_info(path)
        if info.get("port"):
            host = str(info.get("host") or "127.0.0.1")
            if host in ("0.0.0.0", "::", ""):
                host = "127.0.0.1"
            transport = str(info.get("transport") or "tcp")
            return f"{transport}://{host}:{int(info['port'])}"
        raise EQueueSparkError(f"no broker.json with a port in {path!r}; give the \"broker\" option")
    raise EQueueSparkError('option "broker" (host:port) is required to write')


def _check_write_schema(schema: StructType) -> None:
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType

    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise EQueueSparkError(f"writing to equeue needs a 'body' column (binary or string); columns: {sorted(fields)}")
    if not isinstance(fields["body"], (BinaryType, StringType)):
        raise EQueueSparkError(f"column 'body' must be binary or string, not {fields['body'].simpleString()}")
    if "properties" in fields and not (isinstance(fields["properties"], MapType)
                                       and isinstance(fields["properties"].keyType, StringType)
                                       and isinstance(fields["properties"].valueType, StringType)):
        raise EQueueSparkError("column 'properties' must be map<string,string>")
    for name in ("tag", "routing_key"):
        if name in fields and not isinstance(fields[name], StringType):
            raise EQueueSparkError(f"column {name!r} must be a string, not {fields[name].simpleString()}")
    if "keys" in fields and not (isinstance(fields["keys"], StringType) or (
            isinstance(fields["keys"], ArrayType) and isinstance(fields["keys"].elementType, StringType))):
        raise EQueueSparkError("column 'keys' must be array<string> or string")


# writer option -> Producer keyword (docs/spark.md, "Write options")
_SECURITY_OPTIONS = {"tls_ca": "tlsCa", "tls_cert": "tlsCert", "tls_key": "tlsKey",
                     "access_key": "accessKey", "secret_key": "secretKey"}


def send_arrow_batches(options: dict[str, str], batches: Iterator[Any]) -> int:
    """Send every row of the batches to the topic; returns how many the broker acknowledged.

    Rows without a routing_key go out through send_batch in chunks of `batchSize` (default 512),
    each chunk one frame to one queue (the producer's selector spreads chunks over queues). Rows
    with a routing_key are sent with it (hash routing: per-key order), batched by the producer's
    linger, and every future is awaited before the task reports success, so a task that returns
    has had all its rows stored.
    """
    from equeue_core.client import Message, Producer

    topic = _required_topic(options)
    chunk = int_opt(options, "batchSize", 512)
    sent = 0
    # the workers' environment is the Spark daemon's, not the driver's: security settings travel
    # as options (unset ones fall back to EQUEUE_* variables where the worker runs)
    security = {key: opt(options, name) for key, name in _SECURITY_OPTIONS.items()}
    with Producer(broker=_broker_address(options), **security) as producer:
        pending: list = []
        futures: list = []
        for batch in batches:
            cols = batch.schema.names
            body = batch.column("body").to_pylist()
            tags = batch.column("tag").to_pylist() if "tag" in cols else None
            keys = batch.column("keys").to_pylist() if "keys" in cols else None
            props = batch.column("properties").to_pylist() if "properties" in cols else None
            rkeys = batch.column("routing_key").to_pylist() if "routing_key" in cols else None
            for i, b in enumerate(body):
                if b is None:
                    raise EQueueSparkError("a row has a null body")
                k = keys[i] if keys is not None else None
                if isinstance(k, str):
                    k = [k]
                p = props[i] if props is not None else None
                msg = Message(topic, b, tag=tags[i] if tags is not None else None,
                              keys=tuple(x for x in (k or ()) if x is not None),
                              properties=dict(p) if p else None)
                rk = rkeys[i] if rkeys is not None else None
                if rk is not None:
                    futures.append(producer.send_async(msg, routing_key=rk))
                    if len(futures) >= 16 * chunk:
                        for f in futures:
                            f.result()
                        sent += len(futures)
                        futures = []
                    continue
                pending.append(msg)
                if len(pending) >= chunk:
                    producer.send_batch(pending)
                    sent += len(pending)
                    pending = []
        if pending:
            producer.send_batch(pending)
            sent += len(pending)
        producer.flush()
        for f in futures:
            f.result()
        sent += len(futures)
    return sent


class EQueueWriter(DataSourceArrowWriter):
    """Batch write: each task sends its rows through one Producer (at least once)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        _check_write_schema(schema)
        _required_topic(options)
        _broker_address(options)
        self.options = options

    def write(self, iterator: Iterator[Any]) -> EQueueCommitMessage:
        return EQueueCommitMessage(send_arrow_batches(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Sent messages are already stored; nothing to publish."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Messages cannot be unsent: a failed job leaves what it sent (at-least-once)."""


class EQueueStreamWriter(DataSourceStreamArrowWriter):
    """Streaming write: each micro-batch task sends its rows (at least once across restarts)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        _check_write_schema(schema)
        _required_topic(options)
        _broker_address(options)
        self.options = options

    def write(self, iterator: Iterator[Any]) -> EQueueCommitMessage:
        return EQueueCommitMessage(send_arrow_batches(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Sent messages are already stored; nothing to publish."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Messages cannot be unsent: a failed batch is re-run and its rows sent again."""


def offsets_json(offsets: dict[int, int]) -> str:
    """{queue: offset} as the JSON the startingOffset(s)/endingOffset options accept."""
    return json.dumps({str(q): int(o) for q, o in sorted(offsets.items())})
