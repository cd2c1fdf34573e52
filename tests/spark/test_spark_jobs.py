"""The pipeline jobs: incremental Parquet export and the lag/throughput report, on real store data."""

from __future__ import annotations

import io
import json
import os
import time

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from equeue_spark import cli
from equeue_spark.jobs import export, report
from spark_helpers import StoreWriter, commit_offsets, fill, make_body


def test_export_twice_writes_only_the_new_messages(spark, store_name, tmp_path, capsys):
    data, to = str(tmp_path / "data"), str(tmp_path / "export")
    os.makedirs(data)
    fill(store_name, data, "orders", {q: (0, 300) for q in range(3)})

    first = export.run(data, "orders", to, store=store_name, progress=True, spark=spark)
    assert first["rows"] == 900
    assert "3/3 queues" in capsys.readouterr().err  # the progress line
    df = spark.read.parquet(to)
    assert df.count() == 900
    assert {(r.queue_id, str(r.date)) for r in df.select("queue_id", "date").distinct().collect()} == {
        (q, time.strftime("%Y-%m-%d", time.gmtime())) for q in range(3)}
    with open(os.path.join(to, export.STATE_FILE)) as f:
        assert json.load(f)["next"] == {"0": 300, "1": 300, "2": 300}

    fill(store_name, data, "orders", {0: (300, 350), 2: (300, 301)})
    second = export.run(data, "orders", to, store=store_name, progress=False, spark=spark)
    assert second["rows"] == 51
    assert second["queues"] == {0: (300, 350), 1: (300, 300), 2: (300, 301)}
    df = spark.read.parquet(to)
    rows = df.select("queue_id", "queue_offset", "body").collect()
    assert len(rows) == 951
    assert {(r.queue_id, r.queue_offset) for r in rows} == (
        {(q, i) for q in range(3) for i in range(300)} | {(0, i) for i in range(300, 350)} | {(2, 300)})
    assert all(bytes(r.body) == make_body(r.queue_id, r.queue_offset) for r in rows)

    third = export.run(data, "orders", to, store=store_name, progress=False, spark=spark)
    assert third["rows"] == 0 and spark.read.parquet(to).count() == 951


def test_report_numbers_for_a_known_case(store_name, tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    w = StoreWriter(store_name, data)
    try:
        # orders: q0 100, q1 60; "pay" 10 in q0. Everything stored just now (inside the window).
        w.append("orders", 0, [make_body(0, i) for i in range(100)])
        w.append("orders", 1, [make_body(1, i) for i in range(60)])
        w.append("pay", 0, [make_body(0, i) for i in range(10)])
    finally:
        w.close()
    commit_offsets(store_name, data, {("g1", "orders", 0): 40, ("g1", "orders", 1): 60,
                                      ("g2", "orders", 0): 100})
    out = str(tmp_path / "report.csv")
    buf = io.StringIO()
    rows = report.run(data, store=store_name, out=out, window_minutes=2, stream=buf,
                      now_ms=int(time.time() * 1000) + 1000)
    by = {(r["topic"], r["group"]): r for r in rows}
    assert set(by) == {("orders", "g1"), ("orders", "g2"), ("pay", "")}
    g1, g2, pay = by["orders", "g1"], by["orders", "g2"], by["pay", ""]
    assert (g1["messages_in"], g1["consumed"], g1["lag"]) == (160, 100, 60)
    # g2 committed nothing on queue 1: it counts as not consumed
    assert (g2["messages_in"], g2["consumed"], g2["lag"]) == (160, 100, 60)
    assert (pay["messages_in"], pay["consumed"], pay["lag"]) == (10, 0, 10)
    assert g1["msgs_per_min"] == 80.0 and pay["msgs_per_min"] == 5.0  # 160 and 10 in 2 minutes
    text = buf.getvalue()
    assert "messages_in" in text and "orders" in text and "g2" in text
    assert pcsv.read_csv(out).num_rows == 3

    # outside the window: a report "from the future" sees no recent arrivals
    later = report.collect(data, store=store_name, window_minutes=1, now_ms=int(time.time() * 1000) + 3_600_000)
    assert all(r["msgs_per_min"] == 0 for r in later)


def test_cli_runs_both_jobs(spark, store_name, tmp_path, capsys):
    data, to = str(tmp_path / "data"), str(tmp_path / "exp")
    os.makedirs(data)
    fill(store_name, data, "events", {0: (0, 20), 1: (0, 5)})
    assert cli.main(["export", "--data-dir", data, "--topic", "events", "--to", to, "--store", store_name,
                     "--no-progress"]) == 0
    assert "exported 25 new messages" in capsys.readouterr().out
    out = str(tmp_path / "r.parquet")
    assert cli.main(["spark", "report", "--data-dir", data, "--store", store_name, "--out", out]) == 0
    assert "events" in capsys.readouterr().out
    assert pq.read_table(out).to_pylist()[0]["messages_in"] == 25
    assert cli.main(["report", "--data-dir", str(tmp_path / "nope"), "--store", store_name]) == 1
    assert "does not exist" in capsys.readouterr().err
