"""Sync replication: a send is answered once min_insync replicas have it, and refused at once
(not_enough_replicas) when too few are in sync; async replication answers regardless."""

from __future__ import annotations

import asyncio

import pytest

from equeue_core import record
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.message import Message
from equeue_core.client.producer import Producer
from equeue_core.codes import Code
from equeue_core.errors import NotEnoughReplicasError, NotMasterError
from tests.helpers.waiting import wait_until

from .group import master, replica, status, wait_in_sync

TOPIC = "payments"


def _batch(n: int, tag: str) -> list[Message]:
    return [Message(TOPIC, f"{tag}-{i}".encode()) for i in range(n)]


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_sync_send_is_acknowledged_only_after_the_replica_has_its_bytes(tmp_path, flush):
    m = master(tmp_path, replication="sync", flush=flush)
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p:
            for k in range(20):
                p.send_batch(_batch(50, f"b{k}"))
                # answered means replicated: the replica's acked end covers the master's end
                st = status(m)
                assert st["replicas"]["1"]["log_end"] == st["log_end"]


def test_sync_send_with_no_replica_fails_at_once_and_stores_nothing(tmp_path):
    m = master(tmp_path, replication="sync")
    with m.start():
        with Producer(m.address) as p, pytest.raises(NotEnoughReplicasError, match="0 in-sync"):
            p.send(Message(TOPIC, b"nobody copies this"))
        assert status(m)["log_end"] == 0


@pytest.mark.failure
def test_sync_send_fails_with_not_enough_replicas_after_the_replica_is_killed(tmp_path):
    m = master(tmp_path, replication="sync")
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p:
            p.send_batch(_batch(100, "before"))
            r.kill()
            assert wait_until(lambda: status(m)["in_sync"] == [], 15, 0.1), status(m)
            with pytest.raises(NotEnoughReplicasError):  # the refusal, not a request timeout
                p.send_batch(_batch(10, "after"))
            # the replica comes back: sync sends work again once it is in sync
            r.start()
            wait_in_sync(m)
            p.send_batch(_batch(10, "back"))


@pytest.mark.failure
def test_async_send_is_acknowledged_while_the_replica_is_dead(tmp_path):
    m = master(tmp_path, replication="async")
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        r.kill()
        with Producer(m.address) as p:
            results = p.send_batch(_batch(100, "alone"))
        assert [x.queue_offset for x in results] == list(range(100))


def test_sync_send_needing_two_replicas_with_one_in_sync_is_refused_before_storing(tmp_path):
    m = master(tmp_path, replication="sync", min_insync=2)
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p, pytest.raises(NotEnoughReplicasError, match="1 in-sync replica.*needs 2"):
            p.send_batch(_batch(10, "two"))
        assert status(m)["log_end"] == 0


def test_a_stalled_replica_leaves_the_in_sync_set_when_too_far_behind_or_silent_and_rejoins(tmp_path):
    import os
    import signal

    m = master(tmp_path)
    m.env["EQUEUE_REPLICA_MAX_LAG_BYTES"] = "10000"
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:
            with Producer(m.address) as p:  # async replication: answered while the replica is stalled
                p.send_batch([Message(TOPIC, b"x" * 1000) for _ in range(50)])
            st = status(m)
            assert st["in_sync"] == [] and st["replicas"]["1"]["lag_bytes"] > 10000  # too far behind
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        wait_in_sync(m)  # caught up: back in the set
        os.kill(r.proc.pid, signal.SIGSTOP)
        try:  # nothing sent: it leaves the set only by its silence (10 s)
            assert wait_until(lambda: status(m)["in_sync"] == [], 40, 0.5), status(m)
            assert status(m)["replicas"]["1"]["lag_bytes"] == 0
        finally:
            os.kill(r.proc.pid, signal.SIGCONT)
        wait_in_sync(m)


def test_a_sync_send_stored_as_its_broker_is_demoted_is_not_acknowledged(tmp_path):
    """Acknowledged means replicated, even when the master is demoted in the loop turn right after
    it stored the send. The SEND and the demotion go out in one write, so the broker handles them
    in one turn. The replica is frozen, so no acknowledgement of it can come. Before the fix, the
    send's wait for its replicas began a turn later, saw a replica broker (no sync wait needed)
    and answered the send as stored: the failover test lost such a send."""
    m = master(tmp_path, replication="sync")
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p:
            p.send(Message(TOPIC, b"replicated"))  # the topic exists, its queue 0 was written
        body = record.encode_record(TOPIC, b"stored as the master is demoted")

        async def send_and_demote() -> list:
            conn = await BrokerConnection(m.address).connect()
            try:
                return await asyncio.gather(
                    conn.request(Code.SEND, {"topic": TOPIC, "queue_id": 0}, body, timeout=15),
                    conn.request(Code.REPL_DEMOTE, {"master": f"127.0.0.1:{r.port}", "epoch": 1}, timeout=15),
                    return_exceptions=True)
            finally:
                await conn.close()

        with r.frozen():
            sent, demoted = asyncio.run(send_and_demote())
        assert not isinstance(demoted, BaseException), demoted
        assert demoted.header["role"] == "replica"
        assert isinstance(sent, (NotEnoughReplicasError, NotMasterError)), f"the send was answered: {sent!r}"


def test_a_sync_send_back_is_answered_only_once_the_replica_has_it(tmp_path):
    """A consumer commits past a message once its send-back is answered, so with sync replication
    the send-back waits for the replicas as a send does. With the replica frozen it fails after
    the 5 s acknowledgement timeout (it was answered at once before: stored on the master only, a
    failover right then lost the message's retry while its offset was committed)."""
    m = master(tmp_path, replication="sync")
    r = replica(tmp_path, m)
    with m.start(), r.start():
        wait_in_sync(m)
        with Producer(m.address) as p:
            msg_id = p.send(Message(TOPIC, b"fails and goes back")).msg_id

        async def send_back() -> dict:
            conn = await BrokerConnection(m.address).connect()
            try:
                return (await conn.request(Code.SEND_BACK, {"group": "g", "msg_id": msg_id, "max_reconsume": 16},
                                           timeout=30)).header
            finally:
                await conn.close()

        with r.frozen(), pytest.raises(NotEnoughReplicasError, match="not acknowledged"):
            asyncio.run(send_back())
        wait_in_sync(m)
        assert asyncio.run(send_back())["topic"] == "%RETRY%g"
        st = status(m)
        assert st["replicas"]["1"]["log_end"] == st["log_end"]
