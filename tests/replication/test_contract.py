"""The Replication object as the controller's agent drives it: repeated decisions change nothing,
a new epoch on a running master keeps its replicas in sync, and the status says who is who."""

from __future__ import annotations

from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code

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
