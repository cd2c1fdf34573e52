"""A master demoted by hand while it runs (`equeue replication demote`, no restart) cuts the tail
its new master never had, copies the new master's records, and then serves every queue from
offset 0 exactly as the new master does (not only from the first offset it copied)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from equeue_core.client.admin import AdminClient
from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code
from tests.helpers.waiting import wait_until

from .group import log_text, master, replica, request, status, wait_caught_up, wait_in_sync

TOPIC = "ledger"
KEYS = [f"k{i}" for i in range(8)]  # routing keys spread the batches over the topic's queues


def _send(address: str, prefix: str, per_key: int) -> None:
    with Producer(address) as p:
        for key in KEYS:
            p.send_batch([Message(TOPIC, f"{prefix}-{key}-{i}".encode()) for i in range(per_key)],
                         routing_key=key)


def _demote_by_cli(address: str, master_address: str, epoch: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "replication", "demote",
                          "--broker", address, "--master", master_address, "--epoch", str(epoch)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _ranges(address: str) -> list[list[int]]:
    with AdminClient(address) as admin:
        return admin.queue_ranges(TOPIC)


def _records_from_zero(address: str, ranges: list[list[int]]) -> list[list[tuple[int, bytes]]]:
    """Every queue's (offset, body), pulled from offset 0 as a consumer starting there would."""
    with AdminClient(address) as admin:
        return [[(m.queue_offset, m.body) for m in admin.read_queue(TOPIC, q, 0, hi + 1)]
                for q, (_lo, hi) in enumerate(ranges)]


@pytest.mark.parametrize("store", ["file", "lmdb", "rocksdb"])
def test_master_demoted_while_running_serves_its_queues_from_offset_zero(tmp_path, store):
    old = master(tmp_path, name="a", broker_id=0, store=store)
    new = replica(tmp_path, old, name="b", broker_id=1, store=store)
    with old.start(), new.start():
        wait_in_sync(old)
        _send(old.address, "common", 40)
        wait_caught_up(old, new)
        st = request(new, Code.REPL_PROMOTE, {"epoch": 1})
        assert (st["role"], st["epoch"]) == ("master", 1)
        _send(old.address, "unreplicated", 10)  # the old master still takes writes: a tail to cut
        _send(new.address, "after", 5)
        st = _demote_by_cli(old.address, f"127.0.0.1:{new.port}", 1)
        assert st["role"] == "replica"
        wait_caught_up(new, old)
        assert status(old)["log_end"] == status(new)["log_end"]
        assert "truncating" in log_text(old)
        ranges = _ranges(new.address)
        assert sum(hi > 0 for _lo, hi in ranges) >= 2, ranges  # the test must cover several queues
        assert all(lo == 0 for lo, _hi in ranges), ranges
        records = _records_from_zero(new.address, ranges)
        assert sum(len(r) for r in records) == len(KEYS) * 45
        assert _ranges(old.address) == ranges
        old_records = _records_from_zero(old.address, ranges)
        for q, (mine, theirs) in enumerate(zip(old_records, records, strict=True)):
            assert mine == theirs, f"queue {q}: the demoted broker serves other records than its new master"
        assert not any(body.startswith(b"unreplicated-") for r in old_records for _off, body in r)


def test_a_replica_keeps_its_epoch_when_its_master_is_demoted_while_its_fetch_waits(tmp_path):
    """A replica with nothing to copy has a fetch held on the master. The master is demoted (to an
    epoch ahead), and that wakes the held fetch. The fetch must fail (not_master), not answer: its
    answer carried the demoted broker's new epoch, the replica took it, and its next controller
    heartbeat said "replica in the new epoch". That is how a controller sees a newly elected
    master that restarted, so it elected again (tests/controller/test_group_routes.py flapped)."""
    m = master(tmp_path)
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        before = status(r)["epoch"]
        st = request(m, Code.REPL_DEMOTE, {"master": "127.0.0.1:1", "epoch": before + 5})
        assert (st["role"], st["epoch"]) == ("replica", before + 5)
        assert wait_until(lambda: f"replication from 127.0.0.1:{m.port} stopped" in log_text(r), 15, 0.1), \
            log_text(r)[-2000:]
        assert status(r)["epoch"] == before
