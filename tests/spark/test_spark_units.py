"""The source's pure planning logic: option parsing, offset clamping, read-limit sharing."""

from __future__ import annotations

import io

import pytest
from equeue_spark.common import EQueueSparkError, parse_offset_spec, parse_queue_ids
from equeue_spark.datasource import MIN_SLICE, EQueueStreamReader, _plan
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


def _offsets(parts) -> list[tuple[int, int]]:
    return [(q, o) for p in parts for q, s, e in p.slices for o in range(s, e)]


def test_slices_cover_the_range_exactly():
    bounds = {0: (0, 250_000), 1: (10, 10), 2: (3, 4), 5: (7, 90_007)}
    parts = _plan("t", bounds, 100_000)
    assert len(parts) == 4  # ceil(340001 / 100000)
    assert _offsets(parts) == [(q, o) for q in sorted(bounds) for o in range(*bounds[q])]
    assert all(sum(e - s for _, s, e in p.slices) <= 100_000 for p in parts)
    assert all(p.topic == "t" for p in parts)
    assert _plan("t", {0: (5, 5)}, 100) == []


def test_one_long_queue_is_split_so_every_core_gets_a_share():
    parts = _plan("t", {0: (0, 1_000_000)}, 1_000_000, min_partitions=2)
    assert [p.slices for p in parts] == [((0, 0, 500_000),), ((0, 500_000, 1_000_000),)]
    # never below MIN_SLICE offsets per partition, never above maxOffsetsPerPartition
    assert len(_plan("t", {0: (0, 40_000)}, 1_000_000, min_partitions=8)) == 2
    assert len(_plan("t", {0: (0, 3_000_000)}, 1_000_000, min_partitions=2)) == 3


def test_short_queues_share_a_task_instead_of_one_task_per_queue():
    """A Spark task costs ~0.1-0.2 s of CPU whatever it reads: 16 queues of 1000 offsets were 16
    tasks; they are one now, and 4 queues of 250k offsets on 2 cores are 2 tasks, not 4."""
    short = _plan("t", {q: (0, 1000) for q in range(16)}, 1_000_000, min_partitions=2)
    assert len(short) == 1 and short[0].slices == tuple((q, 0, 1000) for q in range(16))
    four = _plan("t", {q: (0, 250_000) for q in range(4)}, 1_000_000, min_partitions=2)
    assert [p.slices for p in four] == [((0, 0, 250_000), (1, 0, 250_000)), ((2, 0, 250_000), (3, 0, 250_000))]
    # uneven queues: equal runs of offsets across queue boundaries
    mixed = _plan("t", {0: (0, 3 * MIN_SLICE), 1: (0, MIN_SLICE)}, 1_000_000, min_partitions=2)
    assert [p.slices for p in mixed] == [((0, 0, 2 * MIN_SLICE),), ((0, 2 * MIN_SLICE, 3 * MIN_SLICE), (1, 0, MIN_SLICE))]


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
