"""The controller's metrics on each name server's Prometheus endpoint (docs/operations.md)."""

from __future__ import annotations

from equeue_core.client.nameserver import NameServerClient
from tests.helpers.broker import free_port
from tests.helpers.controller import ScriptedMember, wait_for_master
from tests.helpers.nameserver import controller_nameservers
from tests.helpers.waiting import wait_until
from tests.test_metrics import scrape


def test_each_name_server_shows_leadership_and_every_groups_epoch_master_and_in_sync_count(tmp_path):
    nss = controller_nameservers(tmp_path)
    for n in nss:
        n.metrics_port = free_port()
    members: list[ScriptedMember] = []
    try:
        for n in nss:
            n.start()
        members += [ScriptedMember(nss, "broker-a", i).start() for i in range(2)]
        with NameServerClient(",".join(n.address for n in nss)) as client:
            g = wait_for_master(client, "broker-a", 30)
            members[g["master_id"]].replication.in_sync = [1 - g["master_id"]]

            def in_sync_everywhere() -> bool:
                return all(s.value == 1 for n in nss for s in scrape(n.metrics_port).get(
                    "equeue_controller_group_in_sync_replicas", []))

            assert wait_until(in_sync_everywhere, 15)
        scrapes = [scrape(n.metrics_port) for n in nss]
        assert sorted(s["equeue_controller_leader"][0].value for s in scrapes) == [0, 0, 1]
        for s in scrapes:
            (epoch,) = s["equeue_controller_group_epoch"]
            (has_master,) = s["equeue_controller_group_has_master"]
            assert epoch.labels == {"cluster": "c1", "group": "broker-a"} and epoch.value == g["epoch"]
            assert has_master.value == 1
        leader = next(s for s in scrapes if s["equeue_controller_leader"][0].value == 1)
        assert leader["equeue_controller_elections"][0].value >= 1
    finally:
        for m in members:
            m.stop()
        for n in nss:
            n.kill()
