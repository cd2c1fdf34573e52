"""Name servers and brokers as real processes on 127.0.0.1 (docs/cluster.md).

Each test starts its own name servers and brokers on free ports and stops every one of them.
Registration intervals and expiry are set small through EQUEUE_* variables where a test waits on
them, and large where the test must prove the other mechanism (a connection close, the push on a
topic change) did the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from equeue_core.client.admin import AdminClient
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.loop import run_sync
from equeue_core.client.nameserver import AsyncNameServerClient, NameServerClient
from equeue_core.codes import Code
from equeue_core.errors import ProtocolError, TopicNotFoundError, TransportError, UnknownRequestError
from tests.helpers.broker import BrokerProcess, free_port
from tests.helpers.nameserver import NameServerProcess, cluster_args, wait_for

SLOW_INTERVAL = {"EQUEUE_REGISTER_INTERVAL_S": "600"}  # only a push or a close can explain a change


def broker_names(ns: NameServerProcess) -> list[str]:
    with NameServerClient(ns.address) as client:
        return [b.name for b in client.cluster_info().brokers]


def route_queues(ns: NameServerProcess, topic: str) -> dict[str, int]:
    with NameServerClient(ns.address) as client:
        try:
            return {b.name: b.queues for b in client.get_route(topic).brokers}
        except TopicNotFoundError:
            return {}


def stats(ns: NameServerProcess) -> dict[str, int]:
    with NameServerClient(ns.address) as client:
        return client.info()["stats"]


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("equeue: "), stderr
    return last


@contextlib.contextmanager
def running(*processes):
    """Start each (in order) and stop each (in reverse), even when the test fails."""
    with contextlib.ExitStack() as stack:
        for p in processes:
            p.start()
            stack.callback(p.stop)
        yield processes


def test_every_nameserver_lists_every_broker_and_routes_a_topic_to_each(tmp_path):
    ns1, ns2 = NameServerProcess(tmp_path), NameServerProcess(tmp_path)
    names = ("broker-a", "broker-b", "broker-c")
    brokers = [BrokerProcess(tmp_path / n, env=SLOW_INTERVAL, extra_args=cluster_args([ns1, ns2], n))
               for n in names]
    with running(ns1, ns2, *brokers):
        for ns in (ns1, ns2):  # a broker prints "listening" after its first registration round
            wait_for(lambda ns=ns: broker_names(ns) == ["broker-a", "broker-b", "broker-c"], timeout=20,
                     what="3 brokers registered")
            with NameServerClient(ns.address) as client:
                addresses = {b.name: b.address for b in client.cluster_info().brokers}
            assert addresses == {n: b.address for n, b in zip(names, brokers, strict=True)}
        for i, b in enumerate(brokers):
            with AdminClient(b.address) as admin:
                admin.create_topic("orders", 2 + i)
        expected = {"broker-a": 2, "broker-b": 3, "broker-c": 4}
        for ns in (ns1, ns2):  # pushed at once on the topic change: the interval is 600 s
            wait_for(lambda ns=ns: route_queues(ns, "orders") == expected, timeout=20, what="route of orders")
            with NameServerClient(ns.address) as client:
                route = client.get_route("orders")
            assert all(r.readable and r.writable and r.cluster == "c1" for r in route.brokers)
        with AdminClient(brokers[1].address) as admin:
            admin.delete_topic("orders")
        for ns in (ns1, ns2):
            wait_for(lambda ns=ns: route_queues(ns, "orders") == {"broker-a": 2, "broker-c": 4}, timeout=20,
                     what="route without broker-b")
        brokers[2].stop()  # a clean stop unregisters
        for ns in (ns1, ns2):
            assert broker_names(ns) == ["broker-a", "broker-b"]
            assert stats(ns)["unregistered"] == 1


@pytest.mark.failure
def test_killed_broker_is_dropped_by_every_nameserver_when_its_connection_closes(tmp_path):
    ns1, ns2 = NameServerProcess(tmp_path, expiry_s=600), NameServerProcess(tmp_path, expiry_s=600)
    a = BrokerProcess(tmp_path / "a", env=SLOW_INTERVAL, extra_args=cluster_args([ns1, ns2], "broker-a"))
    b = BrokerProcess(tmp_path / "b", env=SLOW_INTERVAL, extra_args=cluster_args([ns1, ns2], "broker-b"))
    with running(ns1, ns2, a, b):
        for ns in (ns1, ns2):
            wait_for(lambda ns=ns: broker_names(ns) == ["broker-a", "broker-b"], timeout=20, what="registered")
        a.kill()
        for ns in (ns1, ns2):
            wait_for(lambda ns=ns: broker_names(ns) == ["broker-b"], timeout=15, what="broker-a dropped")
            s = stats(ns)
            assert (s["dropped_on_close"], s["expired"], s["unregistered"]) == (1, 0, 0)


@pytest.mark.failure
def test_frozen_broker_is_dropped_after_broker_expiry_and_returns_when_it_wakes(tmp_path):
    ns = NameServerProcess(tmp_path, expiry_s=4)
    fast = {"EQUEUE_REGISTER_INTERVAL_S": "0.5"}
    a = BrokerProcess(tmp_path / "a", env=fast, extra_args=cluster_args([ns], "broker-a"))
    b = BrokerProcess(tmp_path / "b", env=fast, extra_args=cluster_args([ns], "broker-b"))
    with running(ns, a, b):
        wait_for(lambda: broker_names(ns) == ["broker-a", "broker-b"], timeout=20, what="registered")
        a.proc.send_signal(signal.SIGSTOP)  # its connection stays open: only the silence tells
        try:
            wait_for(lambda: broker_names(ns) == ["broker-b"], timeout=60, what="frozen broker-a expired")
            # hidden from queries at once; the sweep (every expiry/5 s) then counts it as expired
            wait_for(lambda: stats(ns)["expired"] == 1, timeout=30, what="sweep removed broker-a")
            assert stats(ns)["dropped_on_close"] == 0
        finally:
            a.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: broker_names(ns) == ["broker-a", "broker-b"], timeout=30, what="broker-a back")


@pytest.mark.failure
def test_restarted_nameserver_learns_every_route_back_from_the_next_registrations(tmp_path):
    ns1, ns2 = NameServerProcess(tmp_path), NameServerProcess(tmp_path)
    interval = 2.0
    env = {"EQUEUE_REGISTER_INTERVAL_S": str(interval)}
    brokers = [BrokerProcess(tmp_path / n, env=env, extra_args=cluster_args([ns1, ns2], n))
               for n in ("broker-a", "broker-b", "broker-c")]
    with running(ns1, ns2, *brokers):
        for i, b in enumerate(brokers):
            with AdminClient(b.address) as admin:
                admin.create_topic("orders", 1 + i)
        expected = {"broker-a": 1, "broker-b": 2, "broker-c": 3}
        wait_for(lambda: route_queues(ns1, "orders") == expected, timeout=20, what="route before the kill")
        ns1.kill()
        assert route_queues(ns2, "orders") == expected  # the other name server is unaffected
        restarted = NameServerProcess(tmp_path, port=ns1.port)
        with running(restarted):
            assert stats(restarted)["joined"] <= 3  # nothing on disk: it starts from registrations only
            t0 = time.monotonic()
            wait_for(lambda: route_queues(restarted, "orders") == expected, timeout=10 * interval + 30,
                     interval=0.05, what="routes relearned")
            print(f"restarted name server complete after {time.monotonic() - t0:.2f}s "
                  f"(register_interval_s {interval})")
            assert broker_names(restarted) == ["broker-a", "broker-b", "broker-c"]
            assert stats(restarted)["joined"] == 3


def test_broker_keeps_trying_an_unreachable_nameserver_and_logs_the_outage_once(tmp_path):
    port = free_port()
    ns = NameServerProcess(tmp_path, port=port)
    b = BrokerProcess(tmp_path / "a", env={"EQUEUE_REGISTER_INTERVAL_S": "0.2"},
                      extra_args=cluster_args([ns], "broker-a"))
    with running(b):  # starts although its only name server is down
        time.sleep(1.5)  # several retry rounds
        with running(ns):
            wait_for(lambda: broker_names(ns) == ["broker-a"], timeout=20, what="registered once reachable")
            log = wait_for(lambda: "registered c1/broker-a" in b.log_path.read_text() and b.log_path.read_text(),
                           timeout=20, what="registration logged")
    unreachable = [line for line in log.splitlines() if "unreachable" in line]
    assert len(unreachable) == 1, log
    assert f"name server tcp://127.0.0.1:{port} unreachable, retrying every 0.2s" in unreachable[0]
    assert sum("registered c1/broker-a" in line for line in log.splitlines()) == 1, log


@pytest.mark.parametrize("nameserver, error", [
    ("127.0.0.1:9876,127.0.0.1:notaport",
     "equeue: name server address '127.0.0.1:notaport': broker address '127.0.0.1:notaport': 'notaport' is not a port"),
    ("carrier-pigeon://127.0.0.1:9876", "equeue: unknown transport 'carrier-pigeon'; installed: "),
])
def test_malformed_nameserver_address_stops_the_broker_with_one_line(tmp_path, nameserver, error):
    b = BrokerProcess(tmp_path / "a", extra_args=["--nameserver", nameserver])
    done = subprocess.run(b.command(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert one_line_error(done.stderr).startswith(error)


def test_second_broker_with_a_taken_name_exits_with_one_line(tmp_path):
    ns1, ns2 = NameServerProcess(tmp_path), NameServerProcess(tmp_path)
    first = BrokerProcess(tmp_path / "first", extra_args=cluster_args([ns1, ns2], "dup"))
    second = BrokerProcess(tmp_path / "second", extra_args=cluster_args([ns1, ns2], "dup"))
    with running(ns1, ns2, first):
        done = subprocess.run(second.command(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 1
        assert one_line_error(done.stderr) == (
            f"equeue: broker name 'dup' in cluster 'c1' is taken by {first.address}; "
            f"give {second.address} another --name or another --broker-id than 0")
        for ns in (ns1, ns2):
            with NameServerClient(ns.address) as client:
                assert [(b.name, b.address) for b in client.cluster_info().brokers] == [("dup", first.address)]
            assert stats(ns)["refused_conflicts"] == 1
        other_cluster = BrokerProcess(tmp_path / "second", port=second.port,
                                      extra_args=cluster_args([ns1, ns2], "dup", cluster="c2"))
        with running(other_cluster):
            with NameServerClient(ns1.address) as client:
                assert client.cluster_info().clusters == {"c1": ["dup"], "c2": ["dup"]}


def test_route_of_a_topic_no_broker_has_is_a_one_line_error(tmp_path):
    ns = NameServerProcess(tmp_path)
    b = BrokerProcess(tmp_path / "a", extra_args=cluster_args([ns], "broker-a"))
    with running(ns, b):
        with NameServerClient(ns.address) as client, pytest.raises(TopicNotFoundError) as e:
            client.get_route("nowhere")
        assert str(e.value) == "topic 'nowhere' has no route: no live broker registered it"
        cli = [*b.command()[:3], "cluster", "--nameserver", ns.address, "--topic", "nowhere"]
        done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1
        assert one_line_error(done.stderr) == "equeue: topic 'nowhere' has no route: no live broker registered it"
        listing = subprocess.run(cli[:-2], capture_output=True, text=True, timeout=120)
        assert listing.returncode == 0
        assert listing.stdout.splitlines()[0].split() == ["cluster", "broker", "id", "address", "role", "epoch",
                                                          "topics", "last", "heartbeat", "in/s", "out/s"]
        assert listing.stdout.splitlines()[1].split()[:5] == ["c1", "broker-a", "0", b.address, "master"]


def test_nameserver_list_with_nothing_listening_is_a_one_line_error(tmp_path):
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    with NameServerClient(",".join(dead)) as client, pytest.raises(TransportError, match="no name server reachable"):
        client.cluster_info()
    cli = [*BrokerProcess(tmp_path).command()[:3], "cluster", "--nameserver", ",".join(dead)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    line = one_line_error(done.stderr)
    assert line.startswith("equeue: no name server reachable: tcp://")  # it starts at a random one
    assert all(f"tcp://{d}: cannot connect to {d}" in line for d in dead)


def test_client_asks_the_next_nameserver_when_one_is_down(tmp_path):
    ns = NameServerProcess(tmp_path)
    b = BrokerProcess(tmp_path / "a", extra_args=cluster_args([ns], "broker-a"))
    with running(ns, b):
        for _ in range(4):  # whichever it picks first, the live one answers
            with NameServerClient(f"127.0.0.1:{free_port()},{ns.address}") as client:
                assert [r.name for r in client.get_route("%SCHEDULE%").brokers] == ["broker-a"]


def test_malformed_registration_is_refused_and_the_nameserver_goes_on(tmp_path):
    ns = NameServerProcess(tmp_path)
    with running(ns):
        async def probe() -> None:
            conn = await BrokerConnection(ns.address).connect()
            try:
                bad = [{"cluster": "c1", "name": "x", "address": "tcp://h:1", "data_version": 1, "topics": []},
                       {"cluster": "c1", "name": "bad name", "address": "tcp://h:1", "data_version": 1,
                        "topics": {}},
                       {"cluster": "c1", "name": "x", "address": "h:1", "data_version": 1, "topics": {}},
                       {"cluster": "c1", "name": "x", "address": "tcp://h:1", "topics": {}}]
                for header in bad:
                    with pytest.raises(ProtocolError):
                        await conn.request(Code.REGISTER_BROKER, header)
                with pytest.raises(UnknownRequestError):
                    await conn.request(99, {})
                ok = await conn.request(Code.REGISTER_BROKER, {"cluster": "c1", "name": "x",
                                                               "address": "tcp://h:1", "data_version": 1,
                                                               "topics": {"t": {"queues": 2}}})
                assert ok.header == {"cluster": "c1", "name": "x", "expiry_s": 120.0}
            finally:
                await conn.close()

        run_sync(probe())
        assert broker_names(ns) == []  # its registering connection closed: dropped at once
        assert stats(ns)["dropped_on_close"] == 1


@pytest.mark.failure
def test_nameserver_over_zmq_drops_a_killed_zmq_broker(tmp_path):
    ns = NameServerProcess(tmp_path, transport="zmq", expiry_s=600)
    b = BrokerProcess(tmp_path / "a", transport="zmq", env=SLOW_INTERVAL, extra_args=cluster_args([ns], "broker-a"))
    with running(ns, b):
        with NameServerClient(ns.address) as client:
            assert [(x.name, x.address) for x in client.cluster_info().brokers] == [("broker-a", b.address)]
        b.kill()
        wait_for(lambda: broker_names(ns) == [], timeout=30, what="zmq broker dropped")
        assert stats(ns)["dropped_on_close"] == 1


def open_sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


def test_concurrent_route_queries_share_one_connection_per_nameserver(tmp_path):
    ns = NameServerProcess(tmp_path)
    b = BrokerProcess(tmp_path / "a", extra_args=cluster_args([ns], "broker-a"))
    with running(ns, b):
        before = open_sockets(ns.proc.pid)

        async def many() -> tuple[list, int]:
            async with AsyncNameServerClient(ns.address) as client:
                routes = await asyncio.gather(*(client.get_route("%SCHEDULE%") for _ in range(20)))
                return routes, open_sockets(ns.proc.pid) - before

        routes, connections = run_sync(many())
        assert {r.brokers[0].name for r in routes} == {"broker-a"}
        assert connections == 1
