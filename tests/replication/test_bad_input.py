"""Bad input: a replica of another broker group, or one whose epoch is ahead of its master's, is
refused with a clear log line on both sides, and nothing is copied into (or cut from) its log."""

from __future__ import annotations

import pytest

from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code
from equeue_core.errors import NotMasterError, ReplicaRefusedError
from tests.helpers.waiting import wait_until

from .group import log_text, master, replica, request, status


def _send(address: str, n: int, tag: str) -> None:
    with Producer(address) as p:
        p.send_batch([Message("events", f"{tag}-{i}".encode()) for i in range(n)])


def test_a_replica_of_another_group_is_refused_and_copies_nothing(tmp_path):
    m = master(tmp_path)
    stranger = replica(tmp_path, m, group=["--cluster", "c1", "--name", "broker-b"])
    with m.start(), stranger.start():
        _send(m.address, 50, "a")
        assert wait_until(lambda: "replication from" in log_text(stranger) and "refused" in log_text(stranger),
                          30, 0.1), log_text(stranger)
        assert "refused replica" in log_text(m) and "broker-b" in log_text(m)
        assert status(stranger)["log_end"] == 0
        assert status(m)["replicas"] == {}


def test_a_replica_whose_epoch_is_ahead_of_the_master_is_refused_and_keeps_its_log(tmp_path):
    ahead = master(tmp_path, name="x", broker_id=1)
    m = master(tmp_path)
    with ahead.start(), m.start():
        _send(ahead.address, 30, "x")
        st = request(ahead, Code.REPL_PROMOTE, {"epoch": 5})
        assert st["epoch"] == 5
        end = st["log_end"]
        _send(m.address, 80, "m")
        st = request(ahead, Code.REPL_DEMOTE, {"master": f"127.0.0.1:{m.port}"})
        assert st["role"] == "replica"
        assert wait_until(lambda: "ahead" in log_text(ahead), 30, 0.1), log_text(ahead)
        assert "refused replica" in log_text(m)
        assert status(ahead)["log_end"] == end, "a refused replica must neither copy nor truncate"
        with Producer(ahead.address) as p, pytest.raises(NotMasterError):
            p.send(Message("events", b"to a replica"))


def test_promote_with_an_older_epoch_is_refused(tmp_path):
    b = master(tmp_path)
    with b.start():
        assert request(b, Code.REPL_PROMOTE, {"epoch": 3})["epoch"] == 3
        with pytest.raises(ReplicaRefusedError, match="older"):
            request(b, Code.REPL_PROMOTE, {"epoch": 2})
        assert status(b)["epoch"] == 3
