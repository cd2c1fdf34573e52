"""The issue's failover test: a group of three real brokers in controller mode with sync
replication, producers sending continuously, the master killed with kill -9 again and again.

Each cycle: the controller elects a new master from the in-sync set within 10 s at the next
epoch, the producers' sends are acknowledged again, and the killed broker restarts and rejoins as
a replica (it must reach the in-sync set before the next cycle). Afterwards every acknowledged
message is consumed at least once by a new consumer group.
"""

from __future__ import annotations

import threading
import time

import pytest

from equeue_core.client import Consumer
from tests.helpers.failover import ControlledGroup, Senders
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
            g = group.view()
            assert g is not None and g["in_sync"], g
            old = group.brokers[g["master_id"]]
            acked_before = senders.acks_after(0)
            assert wait_until(lambda: senders.acks_after(0) >= acked_before + 50, 30), "producers stalled"
            killed = time.monotonic()
            old.kill()
            g2 = group.wait_master(ELECTION_BOUND_S, epoch_above=g["epoch"])
            elected = time.monotonic() - killed
            assert g2["epoch"] == g["epoch"] + 1 and g2["master_id"] in g["in_sync"], (g, g2)
            assert wait_until(lambda: senders.acks_after(killed + elected) >= 20, 30), \
                f"cycle {cycle}: producers did not resume on the new master"
            first = senders.first_ack_after(killed, group.brokers[g2["master_id"]].port)
            assert first is not None
            print(f"cycle {cycle}: master {g['master_id']} -> {g2['master_id']} epoch {g2['epoch']}, "
                  f"elected after {elected:.2f}s, first ack after {first - killed:.2f}s")
            old.start()  # same data dir and port: it rejoins as a replica and truncates what nobody acked
            group.wait_in_sync({group.brokers.index(old)}, 90)
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
