"""The issue's failover test: a group of three real brokers in controller mode with sync
replication, producers sending continuously, the master killed with kill -9 again and again.

Each cycle: the controller elects a new master from the in-sync set within 10 s at the next
epoch, the producers' sends are acknowledged again, and the killed broker restarts and rejoins as
a replica (it must reach the in-sync set before the next cycle). Afterwards every acknowledged
message is consumed at least once by a new consumer group.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from equeue_core.client import Consumer
from tests.helpers.failover import ControlledGroup, Senders, kill_master_once
from tests.helpers.waiting import wait_until

ELECTION_BOUND_S = 10.0
CYCLES = 20


def consume_all(nameserver: str, topic: str, wanted: set[bytes], timeout: float) -> set[bytes]:
    got: set[bytes] = set()
    lock = threading.Lock()

    def handle(m) -> None:
        with lock:
            got.add(m.body)

    c = Consumer("verify", nameserver=nameserver, consume_from="first")
    c.subscribe(topic)
    c.start(handle)
    try:
        wait_until(lambda: wanted <= got, timeout, 0.2)
    finally:
        c.close()
    return got


@pytest.mark.failure
def test_killing_the_master_20_times_loses_no_acknowledged_message(tmp_path):
    group = ControlledGroup(tmp_path).start()
    senders = None
    try:
        g = group.wait_master(30)
        group.wait_in_sync({i for i in range(group.members) if i != g["master_id"]}, 60)
        group.create_topic("orders", 4)
        senders = Senders(group.nameserver, "orders").start()
        assert wait_until(lambda: len(senders.acked) >= 100, 60), (len(senders.acked), senders.failures)
        for cycle in range(CYCLES):
            r = kill_master_once(group, senders, ELECTION_BOUND_S)
            assert r["epoch"] == r["epoch_before"] + 1 and r["new_master"] in r["in_sync_before"], r
            print(f"cycle {cycle}: {r}")
            old = group.brokers[r["old_master"]]
            old.start()  # same data dir and port: it rejoins as a replica and truncates what nobody acked
            group.wait_in_sync({r["old_master"]}, 90)
        senders.stop()
        acked = set(senders.acked)
        got = consume_all(group.nameserver, "orders", acked, 120)
        missing = acked - got
        print(f"{len(acked)} acknowledged, {senders.failures} failed sends, {len(got)} distinct consumed")
        assert not missing, f"{len(missing)} acknowledged messages never consumed, e.g. {sorted(missing)[:5]}"
    finally:
        if senders is not None:
            senders.stop()
        group.close()


@pytest.mark.failure
def test_a_hung_master_is_replaced_after_the_timeout_and_becomes_a_replica_when_it_wakes(tmp_path):
    group = ControlledGroup(tmp_path).start()
    senders = None
    old = None
    try:
        g = group.wait_master(30)
        g = group.wait_in_sync({i for i in range(group.members) if i != g["master_id"]}, 60)
        group.create_topic("orders", 4)
        senders = Senders(group.nameserver, "orders").start()
        assert wait_until(lambda: len(senders.acked) >= 100, 60)
        old = group.brokers[g["master_id"]]
        os.kill(old.proc.pid, signal.SIGSTOP)  # its connections stay open: only the heartbeat timeout tells
        stopped = time.monotonic()
        g2 = group.wait_master(ELECTION_BOUND_S, epoch_above=g["epoch"])
        print(f"hung master replaced after {time.monotonic() - stopped:.2f}s")
        assert g2["master_id"] in g["in_sync"] and g2["epoch"] == g["epoch"] + 1
        new_port = group.brokers[g2["master_id"]].port
        assert wait_until(lambda: senders.first_ack_after(stopped, new_port) is not None, 30)
        os.kill(old.proc.pid, signal.SIGCONT)

        def old_is_replica() -> bool:
            return any(b.broker_id == g["master_id"] and b.role == "replica" and b.epoch == g2["epoch"]
                       for b in group.client.cluster_info().brokers)

        assert wait_until(old_is_replica, 30), group.client.cluster_info()
        group.wait_in_sync({g["master_id"]}, 90)
        senders.stop()
        acked = set(senders.acked)
        got = consume_all(group.nameserver, "orders", acked, 120)
        assert not acked - got, f"{len(acked - got)} acknowledged messages never consumed"
    finally:
        if old is not None and old.proc is not None:
            os.kill(old.proc.pid, signal.SIGCONT)
        if senders is not None:
            senders.stop()
        group.close()
