"""Shared plumbing of the equeue data source and jobs: options, the Spark schema, opening a store
reader, offset resolution and planning of offset slices.

Everything here is plain Python (no SparkSession needed), so the driver-side planner, the
executors and the jobs resolve options and offsets the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from equeue_core import export
from equeue_core.errors import EQueueError, PluginError
from equeue_core.export import RowFilter, read_broker_info

DEFAULT_STORE = "file"
DEFAULT_MAX_OFFSETS_PER_PARTITION = 1_000_000
DEFAULT_BATCH_ROWS = 16384  # a batch's records (~3 MB at 100 B bodies) stay in cache while its columns are built
STORE_OPTION_PREFIX = "store."

COLUMNS = export.COLUMNS  # the kernel's export layout is the schema


class EQueueSparkError(EQueueError):
    """A bad option or an unreadable store, reported to the Spark user with what to fix."""

    code = "spark"


def spark_schema() -> Any:
    """The DataFrame schema of a read: the export columns, timestamps as Spark TIMESTAMP (UTC)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType([
        StructField("topic", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("queue_offset", LongType()),
        StructField("msg_id", StringType()),
        StructField("tag", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("body", BinaryType()),
        StructField("born_ts", TimestampType()),
        StructField("store_ts", TimestampType()),
    ])


_SPARK_ARROW_SCHEMAS: dict[tuple[str, ...], Any] = {}


def spark_arrow_schema(columns: Sequence[str] | None = None) -> Any:
    """The Arrow schema Spark checks yielded batches against (timestamps in microseconds)."""
    key = tuple(COLUMNS if columns is None else columns)
    schema = _SPARK_ARROW_SCHEMAS.get(key)
    if schema is None:
        import pyarrow as pa

        from equeue_core.export import arrow_schema

        fields = []
        for f in arrow_schema(key):
            if pa.types.is_timestamp(f.type):
                f = f.with_type(pa.timestamp("us", tz="UTC"))
            elif pa.types.is_list(f.type):
                f = f.with_type(pa.list_(pa.field("element", f.type.value_type)))
            fields.append(f)
        schema = _SPARK_ARROW_SCHEMAS[key] = pa.schema(fields)
    return schema


def to_spark_batch(batch: Any) -> Any:
    """Cast one export RecordBatch to the exact Arrow schema Spark expects.

    The store readers emit millisecond timestamps (what records hold); Spark's TIMESTAMP is
    microseconds and Spark refuses a batch whose schema differs, so the two timestamp columns are
    cast (a cheap vectorised multiply; every other column passes through untouched).
    """
    import pyarrow as pa

    target = spark_arrow_schema(batch.schema.names)
    if batch.schema.equals(target):
        return batch
    # column by column (RecordBatch.cast needs pyarrow >= 16; pyproject allows 15)
    return pa.RecordBatch.from_arrays(
        [col if col.type.equals(f.type) else col.cast(f.type) for col, f in zip(batch.columns, target, strict=True)],
        schema=target)


def requested_columns(schema: Any) -> tuple[str, ...]:
    """The export columns a Spark schema asks for, in its order; a field that is not an export
    column, or has another type than the source's, is an error naming it."""
    full = {f.name: f.dataType for f in spark_schema().fields}
    cols = []
    for f in schema.fields:
        if f.name not in full:
            raise EQueueSparkError(f"column {f.name!r} is not an equeue column; columns: {', '.join(COLUMNS)}")
        if f.dataType != full[f.name]:
            raise EQueueSparkError(f"column {f.name!r} is {full[f.name].simpleString()} in equeue, "
                                   f"not {f.dataType.simpleString()}")
        cols.append(f.name)
    return tuple(cols)


def columns_option(options: Mapping[str, str]) -> tuple[str, ...] | None:
    """The `columns` read option ("queue_id,store_ts"): the only columns a read builds."""
    raw = opt(options, "columns")
    if raw is None or not str(raw).strip():
        return None
    cols = tuple(c.strip() for c in str(raw).split(",") if c.strip())
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown or len(set(cols)) != len(cols):
        raise EQueueSparkError(f'option "columns": {raw!r} must name distinct columns among {", ".join(COLUMNS)}')
    return cols


# ---------------------------------------------------------------- options


def opt(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """An option by case-insensitive name (Spark hands us a CaseInsensitiveDict, jobs a dict)."""
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return default


def int_opt(options: Mapping[str, str], name: str, default: int) -> int:
    raw = opt(options, name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise EQueueSparkError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise EQueueSparkError(f"option {name!r} must be > 0, got {value}")
    return value


@dataclass(frozen=True)
class StoreLocation:
    """Where and how to open a store reader; picklable, so it travels to executors."""

    store: str
    path: str
    reader_options: tuple[tuple[str, str], ...] = ()

    def open(self) -> Any:
        return open_store_reader(self.store, self.path, dict(self.reader_options))


def store_location(options: Mapping[str, str]) -> StoreLocation:
    """Resolve `path` (required) and `store` (option, else broker.json's store, else "file")."""
    path = opt(options, "path")
    if not path:
        raise EQueueSparkError('option "path" (the broker data directory) is required')
    store = opt(options, "store") or str(read_broker_info(path).get("store") or DEFAULT_STORE)
    reader_options = tuple(sorted(
        (k[len(STORE_OPTION_PREFIX):], str(v)) for k, v in options.items()
        if k.lower().startswith(STORE_OPTION_PREFIX)))
    return StoreLocation(store, path, reader_options)


def open_store_reader(store: str, path: str, options: dict[str, str] | None = None) -> Any:
    """Open the named store's reader on path, or raise an error that names the store and why.

    An unknown store lists the installed readers; a store whose engine refuses a second process
    (an exclusive lock, a format it cannot open read-only) is reported as such instead of the
    engine's bare exception, so the user knows to stop the broker or pick another store.
    """
    if not os.path.isdir(path):
        raise EQueueSparkError(f"data directory {path!r} does not exist")
    from equeue_core.plugins import get_plugin_manager

    try:
        # the kernel skips (and names, in this error) plugins that fail to import
        factory = get_plugin_manager().store_reader(store)
    except PluginError as e:
        raise EQueueSparkError(f"cannot read store {store!r}: {e}") from e
    try:
        return factory(path, dict(options or {}))
    except EQueueError as e:
        raise EQueueSparkError(f"store {store!r} cannot be read from this process at {path!r}: {e}") from e
    except Exception as e:  # the engine's own error (lock held, not read-only capable, ...)
        raise EQueueSparkError(
            f"store {store!r} cannot be read from this process at {path!r} "
            f"({type(e).__name__}: {e}); its engine may not allow a reader while the broker "
            f"holds it, stop the broker or use a store that supports concurrent readers") from e


# ---------------------------------------------------------------- offsets


def parse_queue_ids(raw: str | None) -> list[int] | None:
    """"0,2" -> [0, 2]; None/"" -> None (all queues)."""
    if raw is None or not str(raw).strip():
        return None
    try:
        return sorted({int(p) for p in str(raw).split(",") if p.strip()})
    except ValueError:
        raise EQueueSparkError(f'option "queues" must be comma-separated queue ids, got {raw!r}') from None


def parse_offset_spec(raw: str | None, name: str) -> int | str | dict[int, int] | None:
    """A per-queue JSON object {"0": 10}, a single number for every queue, "earliest"/"latest"."""
    if raw is None or not str(raw).strip():
        return None
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        value = json.loads(text)
    except ValueError:
        raise EQueueSparkError(f"option {name!r} must be a number, earliest, latest or a JSON object "
                               f'like {{"0": 10}}, got {raw!r}') from None
    if isinstance(value, bool):
        raise EQueueSparkError(f"option {name!r}: {raw!r} is not an offset")
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        try:
            return {int(k): int(v) for k, v in value.items()}
        except (TypeError, ValueError):
            raise EQueueSparkError(f"option {name!r}: keys must be queue ids and values offsets, got {raw!r}") from None
    raise EQueueSparkError(f"option {name!r} must be a number or a JSON object, got {raw!r}")


def parse_ts(raw: str | None, name: str) -> int | None:
    if raw is None or not str(raw).strip():
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise EQueueSparkError(f"option {name!r} must be milliseconds since the epoch, got {raw!r}") from None


def topic_queues(reader: Any, topic: str, wanted: list[int] | None) -> list[int]:
    """The topic's queue ids (restricted to `wanted`); an unknown topic or queue is an error."""
    all_queues = reader.queues()
    if topic not in all_queues:
        known = ", ".join(sorted(all_queues)) or "none"
        raise EQueueSparkError(f"topic {topic!r} is not in the store; topics: {known}")
    present = sorted(all_queues[topic])
    if wanted is None:
        return present
    missing = [q for q in wanted if q not in present]
    if missing:
        raise EQueueSparkError(f"topic {topic!r} has no queue(s) {missing}; queues: {present}")
    return wanted


def resolve_bound(spec: int | str | dict[int, int] | None, ts: int | None, reader: Any, topic: str,
                  q: int, lo: int, hi: int, default: int) -> int:
    """One queue's bound from an offset spec or a timestamp, clamped into [lo, hi]."""
    if ts is not None and spec is None:
        value = reader.offset_for_timestamp(topic, q, ts)
    elif spec == "earliest":
        value = lo
    elif spec == "latest":
        value = hi
    elif isinstance(spec, int):
        value = spec
    elif isinstance(spec, dict):
        value = spec.get(q, default)
    else:
        value = default
    return max(lo, min(hi, int(value)))


def export_slices(location: StoreLocation, topic: str, slices: Sequence[tuple[int, int, int]],
                  batch_rows: int, columns: Sequence[str] | None = None,
                  row_filter: RowFilter | None = None) -> Iterator[Any]:
    """Spark-ready RecordBatches for each (queue id, start, end) slice of the topic in turn, from
    one reader opened here: only `columns` (default all) and only the rows `row_filter` keeps
    (default all).

    The store reader guarantees every offset below its safe end is an intact record, and the
    planner never asks past the end it saw, so a read racing the broker sees a consistent prefix.
    A reader that returns fewer rows than asked (data deleted by retention between planning and
    reading) is a clear error instead of a silent gap: without a row filter the rows are counted;
    with one (fewer rows are expected) the queue must still hold [start, end) after the read.
    """
    reader = location.open()
    try:
        kwargs: dict[str, Any] = {}
        if columns is not None and tuple(columns) != COLUMNS:
            kwargs["columns"] = tuple(columns)
        filtering = row_filter is not None and not row_filter.is_empty()
        if filtering:
            kwargs["row_filter"] = row_filter
        for queue_id, start, end in slices:
            got = 0
            for batch in reader.export(topic, queue_id, start, end, batch_rows, **kwargs):
                if batch.num_rows:
                    got += batch.num_rows
                    yield to_spark_batch(batch)
            lo, hi = reader.queue_range(topic, queue_id) if filtering else (start, end)
            if (got != end - start and not filtering) or lo > start or hi < end:
                raise EQueueSparkError(
                    f"store {location.store!r} returned {got} rows for {topic}/{queue_id} offsets "
                    f"[{start}, {end}), expected {end - start} (retention may have deleted them)")
    finally:
        reader.close()
