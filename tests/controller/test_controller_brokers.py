"""Real broker processes in controller mode (`equeue broker --controller --broker-id N`) with three
controller name servers, and the `equeue cluster` CLI over them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from equeue_core import msgid
from equeue_core.client import AdminClient, Producer
from equeue_core.client.message import Message
from equeue_core.client.nameserver import NameServerClient
from tests.helpers.broker import BrokerProcess
from tests.helpers.controller import ScriptedMember, group_view, wait_for_master
from tests.helpers.nameserver import cluster_args, controller_nameservers
from tests.helpers.waiting import wait_until


@pytest.fixture
def nameservers(tmp_path):
    nss = controller_nameservers(tmp_path)
    try:
        for n in nss:
            n.start()
        yield nss
    finally:
        for n in nss:
            n.kill()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "equeue_core.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


def test_brokers_in_controller_mode_elect_one_master_and_producers_send_to_it(tmp_path, nameservers):
    ns = ",".join(n.address for n in nameservers)
    brokers = [BrokerProcess(tmp_path / f"b{i}", extra_args=[*cluster_args(nameservers, "broker-a"),
                                                            "--broker-id", str(i), "--controller"])
               for i in range(2)]
    try:
        for b in brokers:
            b.start()
        with NameServerClient(ns) as client:
            g = wait_for_master(client, "broker-a", 30)
            master, replica = brokers[g["master_id"]], brokers[1 - g["master_id"]]
            assert g["master_address"] == master.address and g["epoch"] >= 1

            def registered_roles() -> list[tuple[int, str]]:
                return [(b.broker_id, b.role) for b in client.cluster_info().brokers]

            roles = {g["master_id"]: "master", 1 - g["master_id"]: "replica"}
            assert wait_until(lambda: registered_roles() == sorted(roles.items()), 15), registered_roles()
            with AdminClient(nameserver=ns) as admin:
                admin.create_topic("orders", 2)
            route = client.get_route("orders")
            (r,) = route.brokers  # the topic was created on the master (replicas get it by replication)
            assert (r.name, r.address, r.is_master, r.writable) == ("broker-a", master.address, True, True)
            assert set(r.replicas) <= {replica.address}
        with Producer(nameserver=ns) as producer:
            results = [producer.send(Message("orders", f"m{i}".encode())) for i in range(20)]
        assert {r.broker for r in results} == {"broker-a"}
        assert {msgid.decode(r.msg_id)[1] for r in results} == {master.port}

        listing = cli("cluster", "--nameserver", ns, "--interval", "0")
        assert listing.returncode == 0, listing.stderr
        lines = listing.stdout.splitlines()
        group_header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["cluster", "group"])
        row = lines[group_header + 1].split()
        assert row[:4] == ["c1", "broker-a", str(g["master_id"]), master.address]
        assert replica.address in lines[group_header + 1]
    finally:
        for b in brokers:
            b.kill()


def test_cluster_failover_cli_moves_mastership_to_an_in_sync_member_and_refuses_others(nameservers):
    ns = ",".join(n.address for n in nameservers)
    members = [ScriptedMember(nameservers, "broker-a", i).start() for i in range(3)]
    try:
        with NameServerClient(ns) as client:
            g = wait_for_master(client, "broker-a", 30)
            master = members[g["master_id"]]
            target, outside = [m for m in members if m is not master]
            master.replication.in_sync = [target.replication.broker_id]
            assert wait_until(lambda: (group_view(client, "broker-a") or {}).get("in_sync") == [
                target.replication.broker_id], 10)
            refused = cli("cluster", "failover", "--nameserver", ns, "--group", "broker-a",
                          "--to", str(outside.replication.broker_id))
            assert refused.returncode == 1 and "Traceback" not in refused.stderr
            assert refused.stderr.strip().splitlines()[-1] == (
                f"equeue: broker id {outside.replication.broker_id} is not in the in-sync set of group 'broker-a' "
                f"(in-sync: [{target.replication.broker_id}]): electing it could lose acknowledged messages")
            done = cli("cluster", "failover", "--nameserver", ns, "--group", "broker-a",
                       "--to", str(target.replication.broker_id))
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == (f"group c1/broker-a: broker {target.replication.broker_id} "
                                           f"({target.address}) is master at epoch {g['epoch'] + 1}")
            assert wait_until(lambda: target.replication.role == "master" and master.replication.role == "replica", 10)
            shown = cli("cluster", "--nameserver", ns, "--interval", "0")
            assert shown.returncode == 0, shown.stderr
            row = next(line for line in shown.stdout.splitlines() if line.startswith("c1") and "broker-a" in line
                       and len(line.split()) >= 7 and line.split()[2] == str(target.replication.broker_id)
                       and line.split()[3] == target.address and "tcp://" in " ".join(line.split()[4:]))
            assert f" {g['epoch'] + 1} " in row
    finally:
        for m in members:
            m.stop()
