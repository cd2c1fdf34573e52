"""Static failover by hand: the master dies, an admin promotes the replica (`equeue replication
promote`), the old master rejoins as a replica and cuts the tail its new master never had."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from equeue_core.client.admin import AdminClient
from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code
from equeue_core.errors import EQueueError
from tests.conformance.stores.kit import open_store, queue_bytes
from tests.helpers.consume import consume
from tests.helpers.waiting import wait_until

from .group import log_text, master, replica, request, status, wait_caught_up, wait_in_sync
from .test_copy import _same_stores

TOPIC = "ledger"


def _promote_by_cli(address: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "replication", "promote",
                          "--broker", address], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


class Sender:
    """Sends batches in a thread to whichever address `target` holds; remembers what was acked."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.acked: list[bytes] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        producer, at = None, None
        try:
            while not self._stop.is_set():
                bodies = [f"m{n + i}".encode() for i in range(20)]
                n += 20
                try:
                    if at != self.target:
                        if producer is not None:
                            producer.close()
                            producer = None
                        at = self.target
                        producer = Producer(at, send_timeout=10).start()
                    producer.send_batch([Message(TOPIC, b) for b in bodies])
                    self.acked.extend(bodies)
                except EQueueError:
                    self.errors += 1
                    time.sleep(0.05)
        finally:
            if producer is not None:
                producer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.mark.failure
def test_every_acknowledged_sync_send_survives_kill_9_of_the_master_and_a_promotion(tmp_path):
    m = master(tmp_path, replication="sync")
    r = replica(tmp_path, m, replication="sync")
    rejoined = None
    with m.start(), r.start():
        wait_in_sync(m)
        sender = Sender(m.address)
        try:
            assert wait_until(lambda: len(sender.acked) >= 2000, 60), sender.errors
            m.kill()
            st = _promote_by_cli(r.address)
            assert (st["role"], st["epoch"]) == ("master", 1)
            sender.target = r.address
            # the old master comes back as a replica of the new one (same data directory)
            rejoined = replica(tmp_path, r, name="m", broker_id=0, replication="sync").start()
            wait_in_sync(r, broker_id=0)
            before = len(sender.acked)
            assert wait_until(lambda: len(sender.acked) >= before + 2000, 60), sender.errors
        finally:
            sender.stop()
        acked = set(sender.acked)
        with AdminClient(r.address) as admin:
            stored = sum(hi - lo for lo, hi in admin.queue_ranges(TOPIC))
        assert stored >= len(acked)
        got = consume(r.address, "auditors", TOPIC, stored, timeout=120)
        bodies = {bytes(item[3]) for item in got.items}
        missing = acked - bodies
        assert not missing, f"{len(missing)} acknowledged messages were lost, e.g. {sorted(missing)[:5]}"
        wait_caught_up(r, rejoined)
        rejoined.stop()
    assert _same_stores("file", str(r.data_dir), str(rejoined.data_dir)) > 0


@pytest.mark.failure
@pytest.mark.parametrize("store", ["file", "lmdb", "rocksdb"])
def test_rejoining_old_master_truncates_what_it_stored_while_its_replica_was_away(tmp_path, store):
    m = master(tmp_path, replication="async", store=store)
    r = replica(tmp_path, m, store=store)
    with m.start():
        with r.start():
            wait_in_sync(m)
            with Producer(m.address) as p:
                p.send_batch([Message(TOPIC, f"common-{i}".encode()) for i in range(1000)])
            wait_caught_up(m, r)
        with Producer(m.address) as p:  # acknowledged (async), never replicated
            p.send_batch([Message(TOPIC, f"unreplicated-{i}".encode()) for i in range(500)])
        m.kill()
    with r.start():
        st = request(r, Code.REPL_PROMOTE)
        assert (st["role"], st["epoch"]) == ("master", 1)
        with Producer(r.address) as p:
            p.send_batch([Message(TOPIC, f"after-{i}".encode()) for i in range(700)])
        old = replica(tmp_path, r, name="m", broker_id=0, store=store)
        with old.start():
            wait_caught_up(r, old)
            assert status(old)["log_end"] == status(r)["log_end"]
            assert status(old)["epoch"] == 1
        assert "truncating" in log_text(old)
    assert _same_stores(store, str(r.data_dir), str(old.data_dir)) == 1700
    s = open_store(store, str(old.data_dir))
    try:
        everything = b"".join(queue_bytes(s.store, TOPIC, q) for q in s.store.queues()[TOPIC])
    finally:
        s.close()
    assert b"unreplicated-" not in everything and b"after-699" in everything


@pytest.mark.failure
def test_five_static_failovers_in_a_row_lose_no_acknowledged_sync_send(tmp_path):
    """kill -9 of the master under sync producers, promote the replica by hand, the killed broker
    rejoins as the new replica; five times, the roles swapping each time."""
    brokers = {0: master(tmp_path, name="b0", broker_id=0, replication="sync")}
    brokers[1] = replica(tmp_path, brokers[0], name="b1", broker_id=1, replication="sync")
    brokers[0].start()
    brokers[1].start()
    current = 0
    sender = None
    try:
        wait_in_sync(brokers[0], broker_id=1)
        sender = Sender(brokers[0].address)
        for cycle in range(5):
            before = len(sender.acked)
            assert wait_until(lambda b=before: len(sender.acked) >= b + 500, 60), (cycle, sender.errors)
            dead, promoted = current, 1 - current
            brokers[dead].kill()
            st = request(brokers[promoted], Code.REPL_PROMOTE)
            assert (st["role"], st["epoch"]) == ("master", cycle + 1)
            sender.target = brokers[promoted].address
            brokers[dead] = replica(tmp_path, brokers[promoted], name=f"b{dead}", broker_id=dead,
                                    replication="sync").start()
            wait_in_sync(brokers[promoted], broker_id=dead)
            current = promoted
        before = len(sender.acked)
        assert wait_until(lambda: len(sender.acked) >= before + 500, 60), sender.errors
        sender.stop()
        acked = set(sender.acked)
        with AdminClient(brokers[current].address) as admin:
            stored = sum(hi - lo for lo, hi in admin.queue_ranges(TOPIC))
        got = consume(brokers[current].address, "auditors", TOPIC, stored, timeout=120)
        missing = acked - {bytes(item[3]) for item in got.items}
        assert not missing, f"{len(missing)} acknowledged messages were lost, e.g. {sorted(missing)[:5]}"
        wait_caught_up(brokers[current], brokers[1 - current])
    finally:
        if sender is not None:
            sender.stop()
        for b in brokers.values():
            b.stop()
    assert _same_stores("file", str(brokers[0].data_dir), str(brokers[1].data_dir)) >= len(acked)


@pytest.mark.failure
def test_a_delayed_message_waiting_when_the_master_dies_is_delivered_by_the_promoted_replica(tmp_path):
    m = master(tmp_path)
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p:
            p.send(Message(TOPIC, b"later", delay_level=2))  # 5 s
        wait_caught_up(m, r)
        m.kill()
        assert request(r, Code.REPL_PROMOTE)["role"] == "master"
        got = consume(r.address, "late", TOPIC, 1, timeout=60)
        assert [bytes(item[3]) for item in got.items] == [b"later"]
