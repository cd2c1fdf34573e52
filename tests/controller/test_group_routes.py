"""Routes of a broker group through a name server, with real brokers: a static master and replica
(`--role`), and controller-mode brokers moved by hand while producers send."""

from __future__ import annotations

import threading
import time

import pytest

from equeue_core.client import AdminClient, Consumer, Producer
from equeue_core.client.message import Message
from equeue_core.client.nameserver import NameServerClient
from tests.helpers.broker import BrokerProcess
from tests.helpers.failover import ControlledGroup, Senders
from tests.helpers.nameserver import NameServerProcess, cluster_args
from tests.helpers.waiting import wait_until
from tests.replication.group import wait_caught_up


@pytest.mark.failure
def test_consumers_read_from_the_replica_while_the_master_is_down(tmp_path):
    ns = NameServerProcess(tmp_path).start()
    master = BrokerProcess(tmp_path / "m", extra_args=[*cluster_args([ns], "broker-a"), "--broker-id", "0"])
    replica = BrokerProcess(tmp_path / "r", extra_args=[*cluster_args([ns], "broker-a"), "--broker-id", "1",
                                                        "--role", "replica", "--master", f"127.0.0.1:{master.port}"])
    try:
        master.start()
        replica.start()
        with AdminClient(nameserver=ns.address) as admin:
            admin.create_topic("orders", 2)
        with Producer(nameserver=ns.address) as producer:
            for i in range(300):
                producer.send(Message("orders", f"m{i}".encode()))
        sent = {f"m{i}".encode() for i in range(300)}
        wait_caught_up(master, replica)
        with NameServerClient(ns.address) as client:
            # the replica registers the topic once it has it from the master (metadata sync)
            assert wait_until(lambda: client.get_route("orders").brokers[0].replicas == (replica.address,), 40)
            (r,) = client.get_route("orders").brokers
            assert (r.address, r.writable) == (master.address, True)
            got: set[bytes] = set()
            lock = threading.Lock()

            def handle(m) -> None:
                time.sleep(0.01)  # slow: the master dies while the consumer is mid-way
                with lock:
                    got.add(m.body)

            c = Consumer("readers", nameserver=ns.address, consume_from="first", threads=1, pull_batch=4,
                         flow_max_messages=8)  # little pulled ahead: most is pulled after the kill
            c.subscribe("orders")
            c.start(handle)
            try:
                assert wait_until(lambda: len(got) >= 30, 30)
                master.kill()
                assert wait_until(lambda: client.get_route("orders").brokers[0].address == replica.address, 10)
                (r,) = client.get_route("orders").brokers
                assert (r.is_master, r.readable, r.writable, r.replicas) == (False, True, False, ())
                assert len(got) < len(sent)
                # the consumer's pulls fail, it fetches the route again and pulls from the replica
                assert wait_until(lambda: len(got) >= len(sent), 60), (len(got), len(sent))
            finally:
                c.close()
        assert got == sent  # every record, served by the replica
    finally:
        replica.kill()
        master.kill()
        ns.kill()


def test_failover_by_hand_moves_the_producers_to_the_new_master_without_losing_acknowledged_sends(tmp_path):
    group = ControlledGroup(tmp_path, members=2).start()
    senders = None
    try:
        g = group.wait_master(30)
        other = 1 - g["master_id"]
        group.wait_in_sync({other}, 60)
        group.create_topic("orders", 2)
        senders = Senders(group.nameserver, "orders").start()
        assert wait_until(lambda: len(senders.acked) >= 100, 60)
        moved_at = __import__("time").monotonic()
        moved = group.client.elect_master("c1", "broker-a", other)
        assert (moved["master_id"], moved["epoch"]) == (other, g["epoch"] + 1)
        new_port = group.brokers[other].port
        assert wait_until(lambda: senders.first_ack_after(moved_at, new_port) is not None, 20), senders.failures
        assert wait_until(lambda: senders.acks_after(senders.first_ack_after(moved_at, new_port)) >= 100, 30)
        senders.stop()
        acked = set(senders.acked)
        got: set[bytes] = set()
        lock = threading.Lock()

        def handle(m) -> None:
            with lock:
                got.add(m.body)

        c = Consumer("verify", nameserver=group.nameserver, consume_from="first")
        c.subscribe("orders")
        c.start(handle)
        try:
            wait_until(lambda: acked <= got, 60, 0.2)
        finally:
            c.close()
        assert not acked - got, f"{len(acked - got)} acknowledged sends not consumed"
    finally:
        if senders is not None:
            senders.stop()
        group.close()
