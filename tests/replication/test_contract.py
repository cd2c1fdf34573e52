"""The Replication object as the controller's agent drives it: repeated decisions change nothing,
a new epoch on a running master keeps its replicas in sync, and the status says who is who."""

from __future__ import annotations

import asyncio

import pytest

from equeue_core.client.connection import BrokerConnection
from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code
from equeue_core.errors import NotMasterError
from equeue_core.record import encode_record

from .group import master, replica, request, status, wait_caught_up, wait_in_sync


def test_repeated_promote_and_demote_keep_the_in_sync_set_and_the_copy_running(tmp_path):
    m = master(tmp_path, replication="sync")
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        for _ in range(2):
            st = request(m, Code.REPL_PROMOTE, {"epoch": 4})
            assert (st["role"], st["epoch"], st["in_sync"]) == ("master", 4, [1])
            st = request(r, Code.REPL_DEMOTE, {"master": f"127.0.0.1:{m.port}", "epoch": 4})
            assert (st["role"], st["master_address"]) == ("replica", f"127.0.0.1:{m.port}")
        with Producer(m.address) as p:  # sync: answered only because the replica stayed in sync
            p.send_batch([Message("t", f"x{i}".encode()) for i in range(100)])
        wait_caught_up(m, r)
        st = status(r)
        assert st["epoch"] == 4 and st["replicas"] == {} and st["in_sync"] == []
        replicas = status(m)["replicas"]
        assert set(replicas) == {"1"} and replicas["1"]["lag_bytes"] == 0 and replicas["1"]["in_sync"]


def test_a_send_stamped_with_another_epoch_is_refused_not_stored(tmp_path):
    b = master(tmp_path)
    with b.start():
        assert request(b, Code.REPL_PROMOTE, {"epoch": 2})["epoch"] == 2
        body = encode_record("t", b"payload")

        async def send(epoch: int) -> dict:
            conn = await BrokerConnection(b.address).connect()
            try:
                return (await conn.request(Code.SEND, {"topic": "t", "queue_id": 0, "epoch": epoch}, body)).header
            finally:
                await conn.close()

        for stale in (1, 3):  # a client behind the group, or a broker behind the client
            with pytest.raises(NotMasterError) as err:
                asyncio.run(send(stale))
            assert err.value.details.get("epoch") == 2
            assert status(b)["log_end"] == 0
        assert asyncio.run(send(2))["first_offset"] == 0
        assert status(b)["log_end"] > 0


def test_replication_cli_shows_status_and_demotes_a_master_to_a_replica(tmp_path):
    import json
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "equeue_core.cli.main", "replication", *args],
                              capture_output=True, text=True, timeout=60)

    a = master(tmp_path, name="a")
    b = master(tmp_path, name="b", broker_id=1)
    with a.start(), b.start():
        out = cli("status", "--broker", b.address)
        assert out.returncode == 0 and json.loads(out.stdout)["role"] == "master"
        out = cli("demote", "--broker", b.address, "--master", f"127.0.0.1:{a.port}")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["role"] == "replica"
        wait_in_sync(a)
        out = cli("demote", "--broker", b.address)
        assert out.returncode == 2 and "needs --master" in out.stderr
        out = cli("promote", "--broker", b.address, "--epoch", "0")
        assert out.returncode == 1 and out.stderr.startswith("error:")
