"""bench/bench_sections.py at a tiny size: every case's row and summary, and the broker
process's allocator settings taken or left as asked. Nothing here asserts a time."""

from __future__ import annotations

from tests.helpers.bench_rows import bench_rows


def _check(rows: list[dict], malloc_set: bool) -> None:
    rounds = [r for r in rows if r["bench"] == "sections"]
    summaries = [r for r in rows if r["bench"] == "sections_summary"]
    assert sorted({r["round"] for r in rounds}) == [0, 1]
    assert [s["sections_per_frame"] for s in summaries] == [1, 10, 80]
    for r in rounds:
        # every case carries the same messages, in as many frames
        assert r["messages"] >= 2000 and r["frames"] * r["sections_per_frame"] * (880 // r["sections_per_frame"]) == r["messages"], r
        assert r["cpu_us_per_msg"] > 0 and r["page_faults_per_frame"] >= 0, r
        assert (r["malloc"] is not None) == malloc_set, r
    one = [r for r in rounds if r["sections_per_frame"] == 1]
    assert all(r["vs_one_section"] == 1.0 for r in one)
    # each round starts one case further on
    assert [r["position"] for r in one] == [0, 2]


def test_every_case_gives_its_cost_a_message_and_a_section():
    _check(bench_rows("bench.bench_sections", "--count", "2000", "--rounds", "2"), malloc_set=True)


def test_glibc_malloc_leaves_the_thresholds_alone():
    _check(bench_rows("bench.bench_sections", "--count", "2000", "--rounds", "2", "--glibc-malloc"),
           malloc_set=False)
