"""The peers benchmark harness (bench/peers/) at tiny sizes: it runs EQueue (and every peer whose
server and Python client are installed here) end to end, prints well-formed JSON rows and the
ratio table, reports a peer whose binary is missing as skipped, and leaves no process behind.

Nothing here asserts a time: only that each figure is there and positive.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEER_DRIVERS = ["redis_streams", "nats_jetstream", "rabbitmq"]
TINY = ["--quick", "--count", "2000", "--single-count", "50", "--sync-single-count", "20",
        "--latency-seconds", "0.5", "--rate", "1000"]


def _installed_peers() -> list[str]:
    return [d for d in PEER_DRIVERS if importlib.import_module(f"bench.peers.{d}").missing() is None]


def _systems(driver: str) -> list[str]:
    return importlib.import_module(f"bench.peers.{driver}").SYSTEMS


def _run_harness(systems: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """Run the harness in its own process with a marker in its environment, which every process
    it starts inherits; returns the result and the marker."""
    marker = uuid.uuid4().hex
    full_env = dict(env if env is not None else os.environ, EQUEUE_BENCH_RUN=marker)
    r = subprocess.run([sys.executable, "-m", "bench.peers", *TINY, "--systems", ",".join(systems)], cwd=ROOT,
                       env=full_env, capture_output=True, text=True, timeout=600)
    return r, marker


def _rows(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _processes_with(marker: str) -> list[str]:
    found = []
    needle = f"EQUEUE_BENCH_RUN={marker}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            if needle in env.split(b"\0"):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
                found.append(f"{pid}: {cmdline!r}")
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def equeue_and_installed_peers():
    """One harness run over EQueue, every peer installed on this machine (none in CI) and the
    loopback floor."""
    r, marker = _run_harness(["equeue", *_installed_peers(), "loopback_floor"])
    return r, _rows(r.stdout), marker


def test_harness_exits_cleanly_without_failed_workloads(equeue_and_installed_peers):
    r, rows, _ = equeue_and_installed_peers
    assert r.returncode == 0, r.stderr[-3000:]
    assert [row for row in rows if "error" in row] == []


@pytest.mark.parametrize("driver", ["equeue", *_installed_peers()])
def test_every_workload_row_is_well_formed(equeue_and_installed_peers, driver):
    _, rows, _ = equeue_and_installed_peers
    for system in _systems(driver):
        mine = [row for row in rows if row.get("bench") == "peers" and row.get("system") == system
                and row.get("flush") in (None, "async")]
        assert {(row["workload"], row["mode"], row["size"]) for row in mine} >= {
            ("produce", "batch", 100), ("produce", "batch", 1024), ("consume", "drain", 100), ("consume", "drain", 1024),
            ("latency", "sleep", 100), ("latency", "spin", 100), ("single", "sync-each", 100)}, system
        for row in mine:
            assert row["durability"], row
            if row["workload"] == "latency":
                assert row["count"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"], row
                assert row["sent"] == row["count"] and row["achieved_rate"] > 0, row
                # from the slot: each message was sent at or after its slot (both on the wall
                # clock), so no percentile is sooner
                for stat in ("p50_ms", "p99_ms", "max_ms"):
                    assert row[f"due_{stat}"] >= row[stat], row
                # slow messages (over 1 ms from the stamp) and the episodes they came in
                assert 0 <= row["largest_episode"] <= row["over_1ms"] <= row["count"], row
                assert row["slow_episodes"] <= row["over_1ms"], row
                assert (row["slow_episodes"] == 0) == (row["over_1ms"] == 0), row
                assert row["max_ms"] >= 1.0 if row["over_1ms"] else row["max_ms"] <= 1.0, row
                # the clients' CPU: the receiver's from its first message (it got 500, so it
                # read its CPU clock at least twice); a spinning sender's is its whole slot
                assert row["receiver_cpu_us_per_msg"] > 0, row
                if row["mode"].startswith("spin"):
                    assert row["sender_cpu_us_per_msg"] is None, row
                else:
                    assert row["sender_cpu_us_per_msg"] > 0, row
            else:
                assert row["count"] > 0 and row["seconds"] > 0 and row["msgs_per_s"] > 0, row
            # the server's CPU during the row: a server that served messages used some
            messages = row["sent"] if row["workload"] == "latency" else row["count"]
            assert row["server_cpu_s"] > 0, row
            # both figures are rounded (to 0.01 µs, and the total to 1 µs: up to 0.5 µs / messages)
            slack = 0.005 + 0.5 / messages + 1e-9
            assert row["server_cpu_us_per_msg"] == pytest.approx(row["server_cpu_s"] * 1e6 / messages, abs=slack), row
    if driver == "equeue":  # our own: send_async too, and produce/single sends with flush=sync
        for row in rows:
            if row.get("system") == "equeue" and row.get("workload") == "latency":
                assert row["broker_gc_collections"] >= 0 and row["broker_gc_ms"] >= 0, row
        modes = {(row["workload"], row["mode"], row.get("flush")) for row in rows if row.get("system") == "equeue"}
        assert {("produce", "async", "async"), ("produce", "batch", "sync"), ("single", "sync-each", "sync")} <= modes


def test_ratio_table_has_a_row_per_comparison_and_a_column_per_peer(equeue_and_installed_peers):
    r, rows, _ = equeue_and_installed_peers
    ratio_rows = [row for row in rows if row.get("bench") == "peers-ratio"]
    peers = [s for d in _installed_peers() for s in _systems(d)]
    labels = [row["workload"] for row in ratio_rows]
    assert any(label.startswith("produce 100 B") for label in labels)
    assert any(label.startswith("consume") for label in labels)
    assert any(label.startswith("latency p99") for label in labels)
    assert any(label.startswith("latency p99 from the slot") for label in labels)
    for row in ratio_rows:
        assert row["equeue"] is not None and row["equeue"] > 0, row
        for peer in peers:
            assert row[peer] is not None and row[peer] > 0, (peer, row)
    ratio_part = r.stdout.split("\nServer CPU per message")[0]  # the server CPU table follows it
    table = [line for line in ratio_part.splitlines() if line.startswith("|")]
    assert table[0].startswith("| EQueue vs peer") and table[0].count("|") == 3 + len(peers)
    assert len(table) == 2 + len(ratio_rows)


def test_server_cpu_table_has_a_line_per_comparison(equeue_and_installed_peers):
    """Under the ratio table, each system's server CPU per message for the same comparisons (a
    latency comparison once): `peers-server-cpu` rows with the figures of the rows they come from,
    and a printed table with a column per system. The loopback floor is not a peer: no column."""
    r, rows, _ = equeue_and_installed_peers
    found = [row for row in rows if row.get("bench") == "peers-server-cpu"]
    labels = [row["workload"] for row in found]
    assert len(labels) == len(set(labels))
    assert "consume 100 B, default settings" in labels and "latency paced, sender sleeps" in labels
    assert not any("p50" in label or "p99" in label for label in labels)
    peers = [s for d in _installed_peers() for s in _systems(d)]
    ours = {(row["workload"], row["mode"], row["size"], row.get("flush")): row for row in rows
            if row.get("bench") == "peers" and row.get("system") == "equeue"}
    consume = next(row for row in found if row["workload"] == "consume 100 B, default settings")
    assert consume["equeue"] == ours[("consume", "drain", 100, "async")]["server_cpu_us_per_msg"]
    for row in found:
        assert row["equeue"] > 0, row
        assert set(row) == {"bench", "workload", "equeue", *peers}, row
        for peer in peers:
            assert row[peer] is not None and row[peer] > 0, (peer, row)
    part = r.stdout.split("\nServer CPU per message")[1].split("\nClient CPU per message")[0]
    table = [line for line in part.splitlines() if line.startswith("|")]
    assert table[0].count("|") == 3 + len(peers) and len(table) == 2 + len(found)


def test_slow_table_has_a_line_per_latency_comparison(equeue_and_installed_peers):
    """Under the server CPU table, each system's slow messages and the episodes they came in, for
    each latency comparison: `peers-slow` rows whose cells are the rows' [over_1ms, slow_episodes],
    and a printed table with a column per system."""
    r, rows, _ = equeue_and_installed_peers
    found = [row for row in rows if row.get("bench") == "peers-slow"]
    labels = [row["workload"] for row in found]
    assert labels and len(labels) == len(set(labels))
    assert all(label.startswith("latency paced") for label in labels), labels
    peers = [s for d in _installed_peers() for s in _systems(d)]
    ours = {(row["mode"], row.get("flush")): row for row in rows
            if row.get("bench") == "peers" and row.get("system") == "equeue" and row.get("workload") == "latency"}
    push = next(row for row in found if row["workload"] == "latency paced, sender sleeps, EQueue push Consumer")
    assert push["equeue"] == [ours[("sleep-push", "async")]["over_1ms"], ours[("sleep-push", "async")]["slow_episodes"]]
    for row in found:
        assert set(row) == {"bench", "workload", "equeue", *peers}, row
        for system in ("equeue", *peers):
            n, e = row[system]
            assert 0 <= e <= n, (system, row)
    part = r.stdout.split("\nMessages over 1 ms from the stamp")[1].split("\nBounds of this machine")[0]
    table = [line for line in part.splitlines() if line.startswith("|")]
    assert table[0].count("|") == 3 + len(peers) and len(table) == 2 + len(found)


def test_client_cpu_table_has_a_line_per_latency_comparison(equeue_and_installed_peers):
    """Under the server CPU table, each system's client CPU a message for each latency comparison:
    `peers-client-cpu` rows whose cells are the rows' [sender, receiver], and a printed table."""
    r, rows, _ = equeue_and_installed_peers
    found = [row for row in rows if row.get("bench") == "peers-client-cpu"]
    labels = [row["workload"] for row in found]
    assert labels and len(labels) == len(set(labels))
    assert all(label.startswith("latency paced") for label in labels), labels
    ours = {row["mode"]: row for row in rows
            if row.get("bench") == "peers" and row.get("system") == "equeue" and row.get("workload") == "latency"}
    sleeping = next(row for row in found if row["workload"] == "latency paced, sender sleeps")
    assert sleeping["equeue"] == [ours["sleep"]["sender_cpu_us_per_msg"], ours["sleep"]["receiver_cpu_us_per_msg"]]
    spinning = next(row for row in found if row["workload"] == "latency paced, sender spins")
    assert spinning["equeue"][0] is None and spinning["equeue"][1] > 0
    part = r.stdout.split("\nClient CPU per message")[1].split("\nMessages over 1 ms")[0]
    table = [line for line in part.splitlines() if line.startswith("|")]
    peers = [s for d in _installed_peers() for s in _systems(d)]
    assert table[0].count("|") == 3 + len(peers) and len(table) == 2 + len(found)
    assert "n/a / " in part  # the spinning sender's cell


def test_server_cpu_counts_the_process_tree():
    """tree_cpu_seconds: the CPU of a process and of every live process under it (a server's
    workers), from the threads' own nanosecond counters; None once the process is gone."""
    from bench.peers.common import tree_cpu_seconds

    burn = ("import os, sys, time\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\n"
            "print('burnt', flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               f"c = subprocess.Popen([sys.executable, '-c', {burn!r}])\n"
                               "print(c.pid, flush=True)\n"
                               "c.wait()\n"],
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 30
        while (tree_cpu_seconds(child) or 0) < 0.29 and time.monotonic() < deadline:
            time.sleep(0.05)
        own = tree_cpu_seconds(child)
        assert own is not None and own >= 0.29
        whole = tree_cpu_seconds(parent.pid)
        assert whole is not None and whole >= own  # the child's CPU counts for its parent's tree
    finally:
        parent.kill()
        parent.wait()
        if child is not None:
            try:
                os.kill(child, 9)
            except ProcessLookupError:
                pass
    assert tree_cpu_seconds(parent.pid) is None
    assert tree_cpu_seconds(None) is None


def test_loopback_floor_is_a_bound_under_the_table_not_a_peer_column(equeue_and_installed_peers):
    """The floor's single sends (answered at once, and after an fdatasync) come as their own rows
    and as one `peers-bound` line per flush mode, set against EQueue's single sends (and Redis's
    when it is installed); the ratio table has no column for it (the column count above)."""
    r, rows, _ = equeue_and_installed_peers
    floor = {row["flush"]: row for row in rows if row.get("system") == "loopback-floor"}
    assert set(floor) == {"async", "sync"}
    for row in floor.values():
        assert row["workload"] == "single" and row["count"] > 0 and row["msgs_per_s"] > 0, row
    found = {row["workload"]: row for row in rows if row.get("bench") == "peers-bound"}
    assert set(found) == {"single send 100 B, flush=async", "single send 100 B, flush=sync"}
    redis = "redis_streams" in _installed_peers()
    for flush, row in zip(("async", "sync"), found.values(), strict=True):
        assert row["floor_msgs_per_s"] == floor[flush]["msgs_per_s"], row
        assert row["equeue_msgs_per_s"] > 0 and row["equeue_vs_floor"] == round(
            row["equeue_msgs_per_s"] / row["floor_msgs_per_s"], 2), row
        assert (row["floor_vs_redis-streams"] is not None) == redis, row
    lines = r.stdout.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("Bounds of this machine")))
    table = [line for line in lines[at:] if line.startswith("| flush=")]
    assert [line.split(" | ")[0] for line in table] == ["| flush=async", "| flush=sync"]


def test_harness_leaves_no_process_it_started(equeue_and_installed_peers):
    _, _, marker = equeue_and_installed_peers
    assert _processes_with(marker) == []


def test_peer_whose_binary_is_missing_is_reported_as_skipped(tmp_path):
    """A PATH without the peers' servers: every peer system gets a `skipped` row naming the
    missing program and a `skipped` line under the table, and the run still succeeds."""
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    r, marker = _run_harness(PEER_DRIVERS, env=dict(os.environ, PATH=str(empty_bin)))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(r.stdout)
    skipped = {row["system"]: row["skipped"] for row in rows if "skipped" in row}
    expected = {system: binary for driver, binary in (("redis_streams", "redis-server"),
                                                      ("nats_jetstream", "nats-server"),
                                                      ("rabbitmq", "rabbitmq-server"))
                for system in _systems(driver)}
    assert set(skipped) == set(expected)
    for system, binary in expected.items():
        assert f"{binary} not found on PATH" in skipped[system]
        assert f"skipped {system}: {binary} not found on PATH" in r.stdout
    assert not [row for row in rows if row.get("bench") == "peers" and "workload" in row]
    assert _processes_with(marker) == []
