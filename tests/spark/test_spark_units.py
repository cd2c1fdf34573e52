"""The source's pure planning logic: option parsing, offset clamping, read-limit sharing."""

from __future__ import annotations

import io

import pytest
from equeue_spark.common import EQueueSparkError, parse_offset_spec, parse_queue_ids, split_range
from equeue_spark.datasource import EQueueStreamReader, _plan
from equeue_spark.jobs.progress import Progress
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows


def test_offset_specs():
    assert parse_offset_spec(None, "x") is None
    assert parse_offset_spec("42", "x") == 42
    assert parse_offset_spec(" Latest ", "x") == "latest"
    assert parse_offset_spec('{"0": 5, "3": 7}', "x") == {0: 5, 3: 7}
    for bad in ("abc", "true", '{"a": 1}', "[1]"):
        with pytest.raises(EQueueSparkError):
            parse_offset_spec(bad, "x")
    assert parse_queue_ids("2, 0,2") == [0, 2]
    with pytest.raises(EQueueSparkError, match="queues"):
        parse_queue_ids("0,x")


def test_slices_cover_the_range_exactly():
    assert list(split_range(5, 17, 5)) == [(5, 10), (10, 15), (15, 17)]
    parts = _plan("t", {0: (0, 2_500_000), 1: (10, 10), 2: (3, 4)}, 1_000_000)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [
        (0, 0, 1_000_000), (0, 1_000_000, 2_000_000), (0, 2_000_000, 2_500_000), (2, 3, 4)]


def test_one_long_queue_is_split_so_every_core_gets_a_share():
    parts = _plan("t", {0: (0, 1_000_000)}, 1_000_000, min_partitions=2)
    assert [(p.start, p.end) for p in parts] == [(0, 500_000), (500_000, 1_000_000)]
    # never below MIN_SLICE offsets per partition, never above maxOffsetsPerPartition
    assert len(_plan("t", {0: (0, 40_000)}, 1_000_000, min_partitions=8)) == 2
    assert len(_plan("t", {0: (0, 3_000_000)}, 1_000_000, min_partitions=2)) == 3


def test_max_rows_is_shared_fairly_and_never_exceeded():
    cap = EQueueStreamReader._cap
    start = {"0": 0, "1": 100, "2": 50, "3": 7}
    end = {"0": 1000, "1": 110, "2": 50, "3": 1007}
    capped = cap(start, end, 300)
    taken = {q: capped[q] - start[q] for q in start}
    assert sum(taken.values()) == 300
    assert taken == {"0": 145, "1": 10, "2": 0, "3": 145}  # queue 1's unused share goes to the others
    assert cap(start, end, 10_000) == end
    assert sum(cap(start, end, 1)[q] - start[q] for q in start) == 1


def test_read_limit_types():
    r = EQueueStreamReader.__new__(EQueueStreamReader)
    r.max_per_trigger = None
    assert isinstance(r.getDefaultReadLimit(), ReadAllAvailable)
    r.max_per_trigger = 500
    assert r.getDefaultReadLimit() == ReadMaxRows(500)


def test_progress_line():
    out = io.StringIO()
    p = Progress(2, "export t", enabled=True, stream=out)
    p.advance(rows=1500)
    p.advance(rows=10)
    p.finish()
    assert "2/2 queues" in out.getvalue() and "1,510 rows" in out.getvalue()
    assert "rows/s" in out.getvalue() and out.getvalue().endswith("\n")
    quiet = io.StringIO()
    Progress(2, "x", enabled=None, stream=quiet).advance(5)  # not a TTY, a short run: no line yet
    assert quiet.getvalue() == ""
