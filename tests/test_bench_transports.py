"""bench/bench_transports.py at a tiny size over every installed transport: each runs every case
and gets a ratio line against tcp. (It stopped at its first `tls` case for five days: the `tls`
transport needs a certificate, and the benchmark started every transport without settings.)
Nothing here asserts a speed."""

from __future__ import annotations

from equeue_core.plugins import get_plugin_manager
from tests.helpers.bench_rows import bench_rows


def test_every_installed_transport_runs_every_case():
    names = get_plugin_manager().names("equeue_transports")
    assert {"tcp", "tls", "zmq"} <= set(names)
    rows = bench_rows("bench.bench_transports", "--duration", "0.3", "--clients", "1", timeout=600)
    cases = {(row["transport"], row["workload"], row["depth"]) for row in rows if row["bench"] == "transport"}
    assert cases == {(name, workload, depth) for name in names
                     for workload, depth in (("small_rr", 1), ("small_rr", 32), ("bulk_64k", 8))}
    for row in rows:
        if row["bench"] == "transport":
            assert row["requests"] > 0 and row["server_cpu_us_per_req"] > 0, row
    ratios = {(row["transport"], row["workload"], row["depth"]) for row in rows if row["bench"] == "transport_ratio"}
    assert ratios == {case for case in cases if case[0] != "tcp"}
