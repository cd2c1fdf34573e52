"""The broker's Prometheus endpoint and BROKER_STATS: figures move as messages flow through a real broker."""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from equeue_core.broker.metrics import observe_gc_pauses
from equeue_core.client import AdminClient, Message, Producer
from tests.helpers.broker import BrokerProcess, free_port, live_stats_in_process
from tests.helpers.consume import consume


def scrape(port: int) -> dict[str, list]:
    """name -> samples of GET /metrics, parsed with prometheus-client's own text parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        assert r.status == 200
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list, name: str, **labels: str) -> float:
    hits = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


@pytest.fixture
def metrics_broker(tmp_path):
    with BrokerProcess(tmp_path / "data", metrics_port=free_port()) as b:
        yield b


def test_counters_move_as_messages_are_sent_and_consumed(metrics_broker):
    port = metrics_broker.metrics_port
    before = scrape(port)
    assert "equeue_messages_in" in before and "equeue_consumer_group_lag" in before
    with Producer(metrics_broker.address) as p:
        for i in range(0, 3000, 500):
            p.send_batch([Message("orders", b"x" * 100, keys=[f"k{j}"]) for j in range(i, i + 500)])
    m = scrape(port)
    assert value(m["equeue_messages_in"], "equeue_messages_in_total", topic="orders") == 3000
    assert value(m["equeue_bytes_in"], "equeue_bytes_in_total", topic="orders") > 3000 * 100
    sends = value(m["equeue_send_latency_seconds"], "equeue_send_latency_seconds_count")
    assert sends >= 6  # one observation per send request (per batch), never per message
    assert value(m["equeue_send_latency_seconds"], "equeue_send_latency_seconds_bucket", le="+Inf") == sends
    assert value(m["equeue_store_size_bytes"], "equeue_store_size_bytes") > 3000 * 100
    assert value(m["equeue_disk_free_bytes"], "equeue_disk_free_bytes") > 0
    assert value(m["equeue_recovery_clean"], "equeue_recovery_clean") == 1

    col = consume(metrics_broker.address, "billing", "orders", 1000, timeout=60, pull_batch=32)
    assert len(col.items) >= 1000
    m = scrape(port)
    out = value(m["equeue_messages_out"], "equeue_messages_out_total", topic="orders")
    assert out >= 1000
    assert value(m["equeue_bytes_out"], "equeue_bytes_out_total", topic="orders") > out * 100
    assert value(m["equeue_pull_latency_seconds"], "equeue_pull_latency_seconds_count") >= 1
    lag = sum(s.value for s in m["equeue_consumer_group_lag"] if s.labels["group"] == "billing")
    assert {s.labels["queue"] for s in m["equeue_consumer_group_lag"] if s.labels["group"] == "billing"} == {
        "0", "1", "2", "3"}
    assert lag == 3000 - col_committed(metrics_broker, "billing")

    # the flusher runs every 500 ms in async mode: its rounds are timed and counted
    deadline = time.monotonic() + 30
    while value(scrape(port)["equeue_fsyncs"], "equeue_fsyncs_total") == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    m = scrape(port)
    assert value(m["equeue_fsyncs"], "equeue_fsyncs_total") >= 1
    assert value(m["equeue_flush_latency_seconds"], "equeue_flush_latency_seconds_count") >= 1


def col_committed(broker: BrokerProcess, group: str) -> int:
    with AdminClient(broker.address) as admin:
        rows = admin.groups(group)[group]["queues"]
    return sum(r["committed"] or 0 for r in rows)


def test_held_pulls_and_connections_are_gauges_read_at_scrape_time(metrics_broker):
    from equeue_core.client import Consumer

    with AdminClient(metrics_broker.address) as admin:
        admin.create_topic("empty", 4)
    c = Consumer("idle", metrics_broker.address, consume_from="first")
    c.subscribe("empty")
    c.start(lambda m: None)
    try:
        deadline = time.monotonic() + 30
        held = 0.0
        while time.monotonic() < deadline:
            m = scrape(metrics_broker.metrics_port)
            held = value(m["equeue_held_pulls"], "equeue_held_pulls")
            if held >= 4:
                break
            time.sleep(0.2)
        assert held >= 4, "one parked pull per queue of the empty topic"
        assert value(m["equeue_connections"], "equeue_connections") >= 1
        assert value(m["equeue_consumer_group_members"], "equeue_consumer_group_members", group="idle") == 1
    finally:
        c.close()


def test_broker_stats_request_gives_the_same_figures_as_the_endpoint(metrics_broker):
    with Producer(metrics_broker.address) as p:
        p.send_batch([Message("t", b"abc") for _ in range(10)])
    with AdminClient(metrics_broker.address) as admin:
        stats = admin.stats()
    m = scrape(metrics_broker.metrics_port)
    assert stats["topics"]["t"]["messages_in"] == 10
    assert value(m["equeue_messages_in"], "equeue_messages_in_total", topic="t") == 10
    assert stats["disk"]["store_bytes"] > 0 and stats["recovery"]["clean"] is True
    # the GC pause histogram is the same figure in both: a count that only grows, scraped after
    # the stats were taken (how many collections the process ran is its own business)
    assert sum(stats["latency"]["gc"]["counts"]) <= value(m["equeue_gc_pause_seconds"],
                                                          "equeue_gc_pause_seconds_count")
    assert len([x for x in m["equeue_gc_pause_seconds"] if x.name == "equeue_gc_pause_seconds_bucket"]) == 17
    # busy polling: the same counters, which only grow (the scrape came after the stats)
    busy = stats["busy_poll"]
    assert busy["window_us"] == 50 and busy["spins"] >= 1
    assert busy["caught"] <= value(m["equeue_busy_poll_caught"], "equeue_busy_poll_caught_total")
    assert busy["missed"] <= value(m["equeue_busy_poll_missed"], "equeue_busy_poll_missed_total")
    assert busy["spin_seconds"] <= value(m["equeue_busy_poll_seconds"], "equeue_busy_poll_seconds_total")


def test_gc_pauses_are_timed_in_every_collection_until_stopped():
    seen: list[float] = []
    stop = observe_gc_pauses(seen.append)
    try:
        gc.collect()
        gc.collect(0)
    finally:
        stop()
    timed = len(seen)
    assert timed >= 2 and all(0 <= s < 60 for s in seen)
    gc.collect()
    stop()  # twice is harmless
    assert len(seen) == timed


def test_recovery_figures_of_a_crash_show_on_the_next_start(tmp_path):
    b = BrokerProcess(tmp_path / "data", metrics_port=free_port()).start()
    try:
        with Producer(b.address) as p:
            p.send_batch([Message("t", b"abc") for _ in range(10)])
        b.kill()
        b.start()
        m = scrape(b.metrics_port)
        assert value(m["equeue_recovery_clean"], "equeue_recovery_clean") == 0
        assert value(m["equeue_recovery_duration_seconds"], "equeue_recovery_duration_seconds") >= 0
    finally:
        b.stop()


def test_metrics_port_in_use_stops_the_broker_with_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "broker", "--data-dir",
                            str(tmp_path / "d"), "--port", str(free_port()), "--metrics-port", str(taken)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"metrics endpoint 127.0.0.1:{taken} is in use" in r.stderr
    assert "Traceback" not in r.stderr


def test_metrics_port_zero_serves_no_endpoint(tmp_path):
    port = free_port()
    b = BrokerProcess(tmp_path / "data", metrics_port=0).start()
    try:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        with AdminClient(b.address) as admin:
            assert "topics" in admin.stats()
    finally:
        b.stop()


def test_delayed_messages_show_as_scheduler_backlog(metrics_broker):
    with Producer(metrics_broker.address) as p:
        for _ in range(3):
            p.send(Message("later", b"x", delay_level=18))  # due in 2 h
    m = scrape(metrics_broker.metrics_port)
    assert value(m["equeue_scheduled_messages"], "equeue_scheduled_messages") == 3
    assert value(m["equeue_messages_in"], "equeue_messages_in_total", topic="%SCHEDULE%") == 3


def test_nameserver_metrics_follow_registrations_and_route_queries(tmp_path):
    """The name server's endpoint: brokers per cluster, each broker's heartbeat age and topics,
    and the registry's counters, moving as a broker joins, a route is asked and a broker leaves."""
    from equeue_core.client.nameserver import NameServerClient
    from equeue_core.errors import TopicNotFoundError
    from tests.helpers.nameserver import NameServerProcess, cluster_args, wait_for

    port = free_port()
    ns = NameServerProcess(tmp_path, metrics_port=port).start()
    try:
        before = scrape(port)
        assert before["equeue_nameserver_brokers"] == []
        assert before["equeue_nameserver_route_queries"][0].value == 0
        broker = BrokerProcess(tmp_path / "a", extra_args=cluster_args([ns], "broker-a")).start()
        try:
            with Producer(broker.address) as p:
                p.send(Message("metered", b"x"))
            with NameServerClient(ns.address) as client:
                def routed() -> bool:  # not found until the broker's registration names the topic
                    try:
                        return "broker-a" in {b.name for b in client.get_route("metered").brokers}
                    except TopicNotFoundError:
                        return False

                wait_for(routed, timeout=20, what="the route of the new topic")
                with pytest.raises(TopicNotFoundError):
                    client.get_route("nowhere")
            m = scrape(port)
            assert [(s.labels["cluster"], s.value) for s in m["equeue_nameserver_brokers"]] == [("c1", 1)]
            topics = {s.labels["broker"]: s.value for s in m["equeue_nameserver_broker_topics"]}
            assert topics["broker-a"] >= 1
            ages = m["equeue_nameserver_broker_heartbeat_age_seconds"]
            assert ages[0].labels == {"cluster": "c1", "broker": "broker-a"} and ages[0].value >= 0
            assert m["equeue_nameserver_brokers_joined"][0].value == 1
            assert m["equeue_nameserver_route_queries"][0].value >= 2
            assert m["equeue_nameserver_route_misses"][0].value >= 1
        finally:
            broker.stop()
        wait_for(lambda: scrape(port)["equeue_nameserver_brokers"] == [] or None, timeout=20,
                 what="the stopped broker to leave")
        assert scrape(port)["equeue_nameserver_brokers_unregistered"][0].value == 1
    finally:
        ns.stop()


def test_the_broker_process_freezes_its_startup_heap_and_a_broker_in_a_program_does_not(tmp_path):
    """The broker command keeps the objects it holds once started out of the GC's full
    collections (cli/startup_heap.py), and BROKER_STATS counts them. A Broker run inside another
    program (here pytest's) leaves that program's GC as it was."""
    with BrokerProcess(tmp_path / "process") as b, AdminClient(b.address) as admin:
        assert admin.stats()["gc_frozen_objects"] > 1000  # its modules, classes, plugins, config

    before = gc.get_freeze_count()
    assert live_stats_in_process(tmp_path / "in-program")["gc_frozen_objects"] == before
    assert gc.get_freeze_count() == before
