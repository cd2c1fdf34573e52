"""Consumer offsets and topics reach replicas; consumers fall back to a replica while the master
is down, and the offsets they commit there reach the master when it returns (higher wins)."""

from __future__ import annotations

from equeue_core.client.admin import AdminClient
from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code
from tests.helpers.consume import consume
from tests.helpers.waiting import wait_until

from .group import master, replica, wait_caught_up, wait_in_sync

TOPIC = "invoices"
GROUP = "billing"


def _committed(address: str) -> int:
    """The group's committed offsets summed over the topic's queues."""
    with AdminClient(address) as admin:
        total = 0
        for q in range(len(admin.queue_ranges(TOPIC))):
            off = admin.request(Code.QUERY_OFFSET, {"group": GROUP, "topic": TOPIC, "queue_id": q})["offset"]
            total += off or 0
        return total


def test_offsets_committed_on_a_replica_while_the_master_is_down_reach_the_master(tmp_path):
    m = master(tmp_path)
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p:
            p.send_batch([Message(TOPIC, f"first-{i}".encode()) for i in range(100)])
        got = consume(m.address, GROUP, TOPIC, 100)
        assert len(got.items) == 100
        assert wait_until(lambda: _committed(m.address) == 100, 30, 0.2)
        with Producer(m.address) as p:
            p.send_batch([Message(TOPIC, f"second-{i}".encode()) for i in range(60)])
        wait_caught_up(m, r)
        # topics and the group's offsets reached the replica
        assert wait_until(lambda: _committed(r.address) == 100, 30, 0.2)
        m.stop()
        # the master is down: the group goes on from the replica where it left off
        got = consume(r.address, GROUP, TOPIC, 60)
        assert sorted(bytes(x[3]) for x in got.items) == sorted(f"second-{i}".encode() for i in range(60))
        assert wait_until(lambda: _committed(r.address) == 160, 30, 0.2)
        m.start()
        assert wait_until(lambda: _committed(m.address) == 160, 30, 0.2), _committed(m.address)
