"""Helpers for the controller tests: a group of controller name servers, and group members whose
replication status the test scripts.

`ScriptedMember` is a real ControllerAgent (the broker's own code: same heartbeats over TCP to
every name server, same decision handling) whose `replication` is a `ScriptedReplication`: the
status the test sets (role, epoch, log_end, and for the master its in-sync set). It stands in for
a broker's replication plane so the controller's decisions can be driven exactly; stopping it
closes its connections, which the name servers see as they see a `kill -9`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from equeue_core.broker.controller_agent import ControllerAgent
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.client.nameserver import NameServerClient
from equeue_core.nameserver.addresses import parse_nameservers
from tests.helpers.broker import free_port
from tests.helpers.nameserver import NameServerProcess
from tests.helpers.waiting import wait_until


@dataclass
class ScriptedReplication:
    broker_id: int
    role: str = "replica"
    epoch: int = 0
    log_end: int = 0
    master_address: str | None = None
    in_sync: list[int] = field(default_factory=list)
    calls: list[tuple] = field(default_factory=list)  # every become_* call, in order

    def status(self) -> ScriptedReplication:
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "broker_id": self.broker_id, "epoch": self.epoch, "log_end": self.log_end,
                "master_address": self.master_address, "in_sync": list(self.in_sync),
                "replicas": {i: {"lag_bytes": 0, "in_sync": True} for i in self.in_sync}}

    async def become_master(self, epoch: int) -> None:
        self.calls.append(("master", epoch))
        self.role, self.epoch, self.master_address = "master", epoch, None

    async def become_replica(self, master_address: str, epoch: int) -> None:
        self.calls.append(("replica", master_address, epoch))
        self.role, self.epoch, self.master_address, self.in_sync = "replica", epoch, master_address, []


class ScriptedMember:
    def __init__(self, nameservers: list[NameServerProcess], name: str, broker_id: int, log_end: int = 0,
                 cluster: str = "c1", interval_s: float = 0.3) -> None:
        background_loop()
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.replication = ScriptedReplication(broker_id, log_end=log_end)
        self.agent = ControllerAgent(cluster, name, broker_id, self.address,
                                     parse_nameservers(",".join(n.address for n in nameservers)), interval_s,
                                     self.replication)
        self.running = False

    def start(self) -> ScriptedMember:
        async def go() -> None:
            self.agent.start()

        run_sync(go())
        self.running = True
        return self

    def stop(self) -> None:
        if self.running:
            run_sync(self.agent.stop())
            self.running = False


def group_view(client: NameServerClient, name: str, cluster: str = "c1") -> dict[str, Any] | None:
    """The controller leader's view of one group (None if it does not know it or none answers)."""
    try:
        info = client.controller_info()
    except Exception:
        return None
    return next((g for g in info["groups"] if (g["cluster"], g["name"]) == (cluster, name)), None)


def wait_for_master(client: NameServerClient, name: str, timeout: float, epoch_above: int = 0,
                    cluster: str = "c1") -> dict[str, Any]:
    """Wait (bounded) until the group has a master at an epoch above `epoch_above`; its view."""
    seen: dict[str, Any] = {}

    def probe() -> bool:
        g = group_view(client, name, cluster)
        if g is not None:
            seen["g"] = g
        return g is not None and g["master_id"] is not None and g["epoch"] > epoch_above

    assert wait_until(probe, timeout, 0.1), f"no master above epoch {epoch_above} within {timeout}s: {seen}"
    return seen["g"]
