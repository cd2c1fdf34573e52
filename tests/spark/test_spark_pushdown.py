"""Filter pushdown and column pruning of the batch reader, in real Spark local mode.

Every pushed query is compared with a plain Python read of the same store (the store engine's own
read_queue + record.decode, not the export path under test) filtered in Python. Pushdown needs
spark.sql.python.filterPushdown.enabled; the `pushdown` fixture turns it on for one test and off
again. Each query loads a fresh DataFrame: pyspark 4.3 reuses a DataFrame's last pushed plan for
its later actions without pushable filters (docs/spark.md, "Filter pushdown").
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from equeue_spark.datasource import (
    PUSHDOWN_PLANNER,
    EQueueBatchReader,
    EQueueDataSource,
    EQueuePushdownReader,
)
from equeue_spark.pushdown import push_filters
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    Not,
    StringContains,
)
from spark_helpers import make_body, read_df

from equeue_core import record
from equeue_core.contracts import StoreSettings
from equeue_core.plugins import get_plugin_manager

TOPIC = "orders"
QUEUES = 4
EARLY, LATE = 400, 200  # messages per queue before and after t_mid
TAGS = (None, "paid", "new", "paid")


def _tag(q: int, i: int) -> str | None:
    return TAGS[(q + i) % len(TAGS)]


def _append(engine: Any, q: int, lo: int, hi: int) -> None:
    batch = bytearray(b"".join(record.encode_record(TOPIC, make_body(q, i), tag=_tag(q, i), queue_id=q)
                               for i in range(lo, hi)))
    engine.messages.append(TOPIC, q, batch, record.scan(batch))


@pytest.fixture(scope="module")
def store_data(tmp_path_factory) -> Iterator[tuple[str, str, int]]:
    """file-store data: 4 queues, tags cycling None/paid/new, a store-time gap at t_mid."""
    data = str(tmp_path_factory.mktemp("pushdown") / "data")
    os.makedirs(data)
    engine = get_plugin_manager().store_engine("file")(StoreSettings(data_dir=data))
    try:
        for q in range(QUEUES):
            _append(engine, q, 0, EARLY)
        engine.messages.flush()
        time.sleep(0.05)
        t_mid = record.now_ms()
        time.sleep(0.05)
        for q in range(QUEUES):
            _append(engine, q, EARLY, EARLY + LATE)
        engine.messages.flush()
    finally:
        engine.close()
    yield "file", data, t_mid


def _python_rows(store: str, data: str) -> list[dict[str, Any]]:
    """Every stored message through the engine's own read path, decoded record by record."""
    engine = get_plugin_manager().store_engine(store)(StoreSettings(data_dir=data))
    rows = []
    try:
        for q in sorted(engine.messages.queues()[TOPIC]):
            lo, hi = engine.messages.queue_range(TOPIC, q)
            off = lo
            while off < hi:
                got = engine.messages.read_queue(TOPIC, q, off, 1000, 1 << 26)
                for m in record.iter_records(got.records):
                    rows.append({"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
                                 "tag": m.tag, "store_ts": m.store_ts, "body": m.body})
                off = got.next_offset
    finally:
        engine.close()
    return rows


@pytest.fixture
def pushdown(spark) -> Iterator[Any]:
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def _keys(df) -> set[tuple[int, int]]:
    return {(r.queue_id, r.queue_offset) for r in df.select("queue_id", "queue_offset").collect()}


def test_pushed_filters_give_the_rows_a_python_read_gives(pushdown, store_data):
    store, data, t_mid = store_data
    rows = _python_rows(store, data)
    assert len(rows) == QUEUES * (EARLY + LATE)
    ts = f"timestamp_millis({t_mid})"
    cases: dict[str, Any] = {
        f"topic = '{TOPIC}'": lambda r: True,
        "topic = 'other'": lambda r: False,
        "queue_id = 2": lambda r: r["queue_id"] == 2,
        "queue_id in (0, 3)": lambda r: r["queue_id"] in (0, 3),
        "queue_id > 1": lambda r: r["queue_id"] > 1,
        "queue_id <> 1": lambda r: r["queue_id"] != 1,
        "queue_offset >= 100 and queue_offset < 250": lambda r: 100 <= r["queue_offset"] < 250,
        "queue_offset = 7": lambda r: r["queue_offset"] == 7,
        "queue_offset in (3, 401, 599)": lambda r: r["queue_offset"] in (3, 401, 599),
        "tag = 'paid'": lambda r: r["tag"] == "paid",
        "tag in ('paid', 'new')": lambda r: r["tag"] in ("paid", "new"),
        "tag is null": lambda r: r["tag"] is None,
        "tag is not null": lambda r: r["tag"] is not None,
        "tag <> 'paid'": lambda r: r["tag"] is not None and r["tag"] != "paid",
        "not (tag <=> 'paid')": lambda r: r["tag"] != "paid",
        "tag not in ('paid', null)": lambda r: False,
        f"store_ts >= {ts}": lambda r: r["store_ts"] >= t_mid,
        f"store_ts < {ts}": lambda r: r["store_ts"] < t_mid,
        f"store_ts > {ts} - interval 1 day and store_ts <= {ts}": lambda r: r["store_ts"] <= t_mid,
        f"queue_id = 1 and tag = 'paid' and store_ts >= {ts} and queue_offset < 500":
            lambda r: r["queue_id"] == 1 and r["tag"] == "paid" and r["store_ts"] >= t_mid and r["queue_offset"] < 500,
        "queue_id = 1 or tag = 'new'": lambda r: r["queue_id"] == 1 or r["tag"] == "new",
        "queue_id = 3 and body like '%-i12%'": lambda r: r["queue_id"] == 3 and b"-i12" in r["body"],
        "queue_id = 0 and queue_id = 1": lambda r: False,
    }
    for where, keep in cases.items():
        df = read_df(pushdown, store, data, TOPIC).where(where)  # a fresh DataFrame per query
        expected = {(r["queue_id"], r["queue_offset"]) for r in rows if keep(r)}
        assert _keys(df) == expected, where


def test_pushdown_prunes_partitions_and_offsets(pushdown, store_data):
    store, data, t_mid = store_data
    per_queue = str(EARLY + LATE)  # one partition per queue's worth of offsets
    df = read_df(pushdown, store, data, TOPIC, maxOffsetsPerPartition=per_queue)
    assert df.rdd.getNumPartitions() == QUEUES
    assert read_df(pushdown, store, data, TOPIC, maxOffsetsPerPartition=per_queue
                   ).where("queue_id = 2").rdd.getNumPartitions() == 1
    assert read_df(pushdown, store, data, TOPIC).where("topic = 'other'").count() == 0

    # the planner itself (what Spark's pushdown worker calls): queues and offset ranges it plans
    opts = {"path": data, "topic": TOPIC, "store": store}
    reader = EQueuePushdownReader(opts)
    ts = dt.datetime.fromtimestamp(t_mid / 1000, dt.UTC)
    f_queue, f_from, f_to, f_ts, f_body = (In(("queue_id",), (1, 3)), GreaterThanOrEqual(("queue_offset",), 50),
                                           LessThan(("queue_offset",), 450), GreaterThanOrEqual(("store_ts",), ts),
                                           StringContains(("body",), "x"))
    rest = list(reader.pushFilters([f_queue, f_from, f_to, f_ts, f_body]))
    assert rest == [f_body] and rest[0] is f_body  # only the body filter is left to Spark
    planned = [s for p in reader.partitions() for s in p.slices]
    # store_ts >= t_mid starts every queue at its first late message (offset EARLY)
    assert planned == [(1, EARLY, 450), (3, EARLY, 450)]
    batches = list(reader.read(reader.partitions()[0]))
    assert sum(b.num_rows for b in batches) == 100

    # without pushed filters the same reader plans everything
    assert sum(e - s for p in EQueueBatchReader(opts).partitions() for _, s, e in p.slices) == QUEUES * (EARLY + LATE)


def test_tag_filter_runs_inside_the_reader(store_data):
    store, data, _ = store_data
    reader = EQueuePushdownReader({"path": data, "topic": TOPIC, "store": store})
    assert list(reader.pushFilters([EqualTo(("tag",), "new"), EqualTo(("queue_id",), 0)])) == []
    (part,) = reader.partitions()
    got = [r for b in reader.read(part) for r in b.to_pylist()]
    assert {r["tag"] for r in got} == {"new"}
    assert len(got) == sum(1 for i in range(EARLY + LATE) if _tag(0, i) == "new")


def test_filters_it_cannot_handle_are_returned_by_reference():
    odd = [EqualTo(("keys",), ["a"]), Not(LessThan(("queue_offset",), 5)), EqualNullSafe(("msg_id",), "x"),
           In(("queue_offset",), (4, 9)), Not(In(("tag",), ("a", None))), IsNull(("body",)),
           EqualTo(("a", "b"), 1), EqualTo(("queue_id",), "2")]
    pushed, rest = push_filters(odd, TOPIC)
    assert len(rest) == len(odd) and all(a is b for a, b in zip(rest, odd, strict=True))
    # `queue_offset IN (4, 9)` still narrows the read to [4, 9]; Spark picks the two offsets
    assert (pushed.offset_min, pushed.offset_max) == (4, 9)
    pushed, rest = push_filters([EqualTo(("tag",), "a"), IsNull(("tag",))], TOPIC)
    assert rest == [] and pushed.nothing


def test_reads_without_the_pushdown_setting_still_work(spark, store_data):
    """pyspark refuses a reader that overrides pushFilters when the setting is off; the source then
    hands out its plain reader, so reads plan every queue and Spark filters."""
    store, data, _ = store_data
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "false"
    df = read_df(spark, store, data, TOPIC, maxOffsetsPerPartition=str(EARLY + LATE)
                 ).where("queue_id = 2 and tag = 'paid'")
    assert df.rdd.getNumPartitions() == QUEUES
    assert df.count() == sum(1 for i in range(EARLY + LATE) if _tag(2, i) == "paid")


class _WrappedSource(EQueueDataSource):
    """A subclass whose reader() runs a dozen calls below its caller (as a decorator or a
    logging wrapper would make it)."""

    def reader(self, schema):
        def deeper(n: int):
            return deeper(n - 1) if n else EQueueDataSource.reader(self, schema)
        return deeper(12)


def test_the_pushdown_planner_gets_the_pushdown_reader_through_wrappers(store_data, monkeypatch):
    """The source used to recognise pyspark's pushdown planner by walking at most 8 stack frames
    up from reader(): a wrapped reader() got the plain reader there and its queries silently lost
    pushdown. The planner is recognised by its process now (the planner module is loaded there,
    and nowhere else), whatever the call depth."""
    store, data, _ = store_data
    opts = {"path": data, "topic": TOPIC, "store": store}
    schema = EQueueDataSource(opts).schema()

    def from_planner_code(source: EQueueDataSource):
        """reader() called from code of pyspark's planner file, as the planner calls it."""
        scope = {"source": source, "schema": schema}
        exec(compile("got = source.reader(schema=schema)", "data_source_pushdown_filters.py", "exec"), scope)
        return scope["got"]

    assert PUSHDOWN_PLANNER not in sys.modules  # this test process is no planner
    assert type(_WrappedSource(opts).reader(schema)) is EQueueBatchReader
    monkeypatch.setitem(sys.modules, PUSHDOWN_PLANNER, types.ModuleType(PUSHDOWN_PLANNER))
    assert type(from_planner_code(EQueueDataSource(opts))) is EQueuePushdownReader
    assert type(from_planner_code(_WrappedSource(opts))) is EQueuePushdownReader


def test_columns_option_and_a_given_schema_build_only_those_columns(spark, store_data):
    store, data, _ = store_data
    df = read_df(spark, store, data, TOPIC, columns="queue_id,queue_offset,tag")
    assert df.columns == ["queue_id", "queue_offset", "tag"]
    assert df.count() == QUEUES * (EARLY + LATE)
    assert df.where("queue_id = 1 and queue_offset = 5").first().tag == _tag(1, 5)
    given = (spark.read.format("equeue").schema("queue_offset bigint, body binary")
             .option("store", store).option("path", data).option("topic", TOPIC).load())
    row = given.where("queue_offset = 9").orderBy(F.length("body")).first()
    assert row.body in {make_body(q, 9) for q in range(QUEUES)}
    with pytest.raises(Exception, match="column 'queue_id' is int in equeue, not bigint"):
        (spark.read.format("equeue").schema("queue_id bigint").option("store", store)
         .option("path", data).option("topic", TOPIC).load().count())
    with pytest.raises(Exception, match='option "columns"'):
        read_df(spark, store, data, TOPIC, columns="queue_id,nope").count()


def test_every_store_gives_the_same_rows_with_pushdown(pushdown, store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    engine = get_plugin_manager().store_engine(store_name)(StoreSettings(data_dir=data))
    try:
        for q in range(2):
            _append(engine, q, 0, 300)
        engine.messages.flush()
    finally:
        engine.close()
    rows = _python_rows(store_name, data)
    where = "queue_id = 1 and tag in ('paid', 'new') and queue_offset between 10 and 200"
    df = read_df(pushdown, store_name, data, TOPIC, columns="queue_id,queue_offset,tag").where(where)
    assert _keys(df) == {(r["queue_id"], r["queue_offset"]) for r in rows
                         if r["queue_id"] == 1 and r["tag"] in ("paid", "new") and 10 <= r["queue_offset"] <= 200}
