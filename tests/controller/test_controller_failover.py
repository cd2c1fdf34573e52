"""The controller in the name servers: three real name server processes on 127.0.0.1 running the
Raft group (pysyncobj), group members heartbeating them over TCP.

Members are ScriptedMembers (tests/helpers/controller.py): the broker's own ControllerAgent with a
replication status the test sets, so the in-sync set and log ends the controller decides from are
exact. Real broker processes in controller mode are in test_controller_brokers.py.
"""

from __future__ import annotations

import time

import pytest

from equeue_core.client.nameserver import NameServerClient
from equeue_core.errors import FailoverRefusedError, NoQuorumError, NotLeaderError
from tests.helpers.controller import ScriptedMember, group_view, wait_for_master
from tests.helpers.nameserver import controller_nameservers
from tests.helpers.waiting import wait_until

ELECTION_BOUND_S = 10.0  # the bound from the master's loss to a new master


@pytest.fixture
def nameservers(tmp_path):
    nss = controller_nameservers(tmp_path, env={"EQUEUE_CONTROLLER_MASTER_TIMEOUT_S": "3"})
    try:
        for n in nss:
            n.start()
        yield nss
    finally:
        for n in nss:
            n.kill()


@pytest.fixture
def client(nameservers):
    with NameServerClient(",".join(n.address for n in nameservers)) as c:
        yield c


@pytest.fixture
def members():
    started: list[ScriptedMember] = []
    yield started
    for m in started:
        m.stop()


def start_group(nameservers, members, client, log_ends=(100, 100, 100)):
    """A group of len(log_ends) members; the master elected, every replica in its in-sync set."""
    for i, end in enumerate(log_ends):
        members.append(ScriptedMember(nameservers, "broker-a", i, log_end=end).start())
    g = wait_for_master(client, "broker-a", 30)
    master = members[g["master_id"]]
    master.replication.in_sync = [m.replication.broker_id for m in members if m is not master]
    assert wait_until(lambda: (group_view(client, "broker-a") or {}).get("in_sync") == master.replication.in_sync, 15)
    return g, master


def leader_of(nameservers, client):
    info = client.controller_info()
    assert info["state"] == "leader", info
    port = int(info["self"].rsplit(":", 1)[1])
    return next(n for n in nameservers if n.controller_port == port)


def test_a_new_group_gets_exactly_one_master_and_every_member_follows_it(nameservers, client, members):
    g, master = start_group(nameservers, members, client)
    assert g["epoch"] >= 1 and set(g["members"]) == {"0", "1", "2"}
    assert wait_until(lambda: all(m.replication.epoch == g["epoch"] for m in members), 10)
    assert [m.replication.role for m in members].count("master") == 1
    assert master.replication.role == "master"
    assert all(m.replication.master_address == master.address for m in members if m is not master)


@pytest.mark.failure
def test_a_lost_master_is_replaced_by_the_in_sync_member_with_the_longest_log_at_the_next_epoch(
        nameservers, client, members):
    g, master = start_group(nameservers, members, client, log_ends=(500, 500, 500))
    others = [m for m in members if m is not master]
    others[0].replication.log_end, others[1].replication.log_end = 300, 400  # the second has more
    time.sleep(1.0)  # their next heartbeats carry the new log ends
    lost = time.monotonic()
    master.stop()
    g2 = wait_for_master(client, "broker-a", ELECTION_BOUND_S, epoch_above=g["epoch"])
    print(f"new master after {time.monotonic() - lost:.2f}s")
    assert g2["epoch"] == g["epoch"] + 1
    assert g2["master_id"] == others[1].replication.broker_id
    assert wait_until(lambda: others[1].replication.role == "master" and others[0].replication.master_address
                      == others[1].address, 10)


@pytest.mark.failure
def test_failover_still_works_after_the_raft_leader_name_server_is_killed(nameservers, client, members):
    g, master = start_group(nameservers, members, client)
    leader_of(nameservers, client).kill()
    master.stop()
    g2 = wait_for_master(client, "broker-a", ELECTION_BOUND_S + 5, epoch_above=g["epoch"])
    assert g2["master_id"] != master.replication.broker_id and g2["epoch"] == g["epoch"] + 1


@pytest.mark.failure
def test_a_master_with_no_live_in_sync_member_stays_down(nameservers, client, members):
    g, master = start_group(nameservers, members, client)
    master.replication.in_sync = []  # the replicas fell behind: the master says nobody is in sync
    assert wait_until(lambda: (group_view(client, "broker-a") or {}).get("in_sync") == [], 10)
    master.stop()
    time.sleep(3 + 3)  # a master timeout and more
    now = group_view(client, "broker-a")
    assert now is not None and (now["master_id"], now["epoch"]) == (g["master_id"], g["epoch"])
    assert all(m.replication.role == "replica" for m in members if m is not master)


def test_failover_by_hand_moves_mastership_to_an_in_sync_member_only(nameservers, client, members):
    g, master = start_group(nameservers, members, client)
    target = next(m for m in members if m is not master)
    master.replication.in_sync = [target.replication.broker_id]  # the third fell out of the in-sync set
    assert wait_until(lambda: (group_view(client, "broker-a") or {}).get("in_sync") == master.replication.in_sync, 10)
    outside = next(m for m in members if m is not master and m is not target)
    with pytest.raises(FailoverRefusedError, match=r"not in the in-sync set"):
        client.elect_master("c1", "broker-a", outside.replication.broker_id)
    with pytest.raises(FailoverRefusedError, match=r"not a member"):
        client.elect_master("c1", "broker-a", 7)
    moved = client.elect_master("c1", "broker-a", target.replication.broker_id)
    assert (moved["master_id"], moved["epoch"]) == (target.replication.broker_id, g["epoch"] + 1)
    assert wait_until(lambda: target.replication.role == "master" and master.replication.role == "replica"
                      and master.replication.master_address == target.address, 10)


def test_a_follower_name_server_refuses_to_elect_and_names_the_leader(nameservers, client, members):
    start_group(nameservers, members, client)
    leader = leader_of(nameservers, client)
    follower = next(n for n in nameservers if n is not leader)
    with NameServerClient(follower.address) as one:
        with pytest.raises(NotLeaderError) as e:
            one.elect_master("c1", "broker-a")
    assert str(leader.controller_port) in str(e.value)


@pytest.mark.failure
def test_a_minority_controller_refuses_to_decide(nameservers, client, members):
    g, master = start_group(nameservers, members, client)
    survivor = leader_of(nameservers, client)
    for n in nameservers:
        if n is not survivor:
            n.kill()
    with NameServerClient(survivor.address) as one:
        # a leader cut off from the majority steps down within seconds, or cannot commit
        with pytest.raises((NotLeaderError, NoQuorumError)):
            for _ in range(20):
                one.elect_master("c1", "broker-a")
                time.sleep(0.5)
        master.stop()
        time.sleep(3 + 3)
        info = one.controller_info()
    now = next(x for x in info["groups"] if x["name"] == "broker-a")
    assert (now["master_id"], now["epoch"]) == (g["master_id"], g["epoch"])
    assert all(m.replication.role == "replica" for m in members if m is not master)
