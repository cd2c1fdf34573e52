"""ControllerAgent: a broker in controller mode (`--controller`) reports its replication status to
every name server each `controller_heartbeat_s` and does what the controller decided.

A heartbeat carries the broker's identity and `broker.replication.status()` (role, epoch,
log_end, master_address, and for a master its in-sync set and per-replica lag). Each name server
answers with the group's committed decision: the master's broker id and address at an epoch.
The agent applies a decision with `become_master(epoch)` or `become_replica(master, epoch)` when
it differs from what the broker is; a decision of an older epoch than the broker's is stale (a
name server that has not caught up) and ignored. Decisions are applied one at a time. The broker
starts as a replica with no master and writes nothing until the controller names a master.

A broker without the replication data plane (no `broker.replication`) still takes part: the
agent then keeps the role and epoch itself and reports log_end 0, so the controller's decisions
can be observed (and tested) on their own.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from equeue_core.client.address import Address
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.credentials import ClientLink
from equeue_core.codes import Code
from equeue_core.contracts import TransportSettings
from equeue_core.errors import EQueueError, TransportError

if TYPE_CHECKING:
    from equeue_core.broker.registration import BrokerRegistrar

log = logging.getLogger("equeue.broker.controller")

REQUEST_TIMEOUT = 3.0


@dataclass
class _OwnStatus:
    """The status kept by the agent itself when the broker has no replication plane."""

    role: str = "replica"
    epoch: int = 0
    log_end: int = 0
    master_address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "epoch": self.epoch, "log_end": self.log_end,
                "master_address": self.master_address, "in_sync": [], "replicas": {}}


def status_dict(status: Any) -> dict[str, Any]:
    """A ReplicationStatus (or anything with to_dict / the same attributes) as a plain dict."""
    if hasattr(status, "to_dict"):
        return dict(status.to_dict())
    return {k: getattr(status, k) for k in ("role", "epoch", "log_end", "master_address", "in_sync", "replicas")}


class ControllerAgent:
    def __init__(self, cluster: str, name: str, broker_id: int, address: str, nameservers: list[Address],
                 interval_s: float, replication: Any = None, settings: TransportSettings | None = None,
                 link: ClientLink | None = None) -> None:
        """`link`: the broker's own outgoing credentials (TLS, CURVE, signing; client/credentials.py),
        the registrar's, so heartbeats pass the same checks as registration."""
        self.cluster, self.name, self.broker_id, self.address = cluster, name, broker_id, address
        self.nameservers = nameservers
        self.interval_s = interval_s
        self.replication = replication
        self.own = _OwnStatus()
        self.settings = settings or TransportSettings(connect_timeout=REQUEST_TIMEOUT)
        self.link = link or ClientLink(self.settings, None)
        self.on_change: Any = None  # called after a decision was applied (the registrar re-registers)
        self.decisions = 0  # decisions applied
        self._conns: dict[Address, BrokerConnection] = {}
        self._state: dict[Address, str] = {}
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []

    @classmethod
    def for_registrar(cls, registrar: BrokerRegistrar, broker: Any) -> ControllerAgent:
        cfg = broker.config
        return cls(registrar.cluster, registrar.name, cfg.broker_id, registrar.address, [link.address for link in
                   registrar.links], cfg.controller_heartbeat_s, getattr(broker, "replication", None),
                   settings=registrar.settings, link=registrar.link_settings)

    def status(self) -> dict[str, Any]:
        if self.replication is not None:
            return status_dict(self.replication.status())
        return self.own.to_dict()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(a)) for a in self.nameservers]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            await c.close()

    # ------------------------------------------------------------ heartbeats

    def _header(self) -> dict[str, Any]:
        st = self.status()
        replicas = {str(k): {f: v for f, v in r.items() if isinstance(v, (int, float, str, bool)) or v is None}
                    for k, r in (st.get("replicas") or {}).items() if isinstance(r, dict)}
        return {"cluster": self.cluster, "name": self.name, "broker_id": self.broker_id, "address": self.address,
                "role": st["role"], "epoch": int(st["epoch"]), "log_end": int(st["log_end"]),
                "master_address": st.get("master_address"), "in_sync": [int(i) for i in st.get("in_sync") or []],
                "replicas": replicas}

    async def _run(self, address: Address) -> None:
        while True:
            try:
                await self.heartbeat(address)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the heartbeats to this name server
                log.exception("controller heartbeat to %s failed", address)
            await asyncio.sleep(self.interval_s)

    async def heartbeat(self, address: Address) -> dict[str, Any] | None:
        """One heartbeat to one name server, and apply its answer. None when it did not answer."""
        try:
            conn = self._conns.get(address)
            if conn is None:
                conn = self._conns[address] = await self._connect(address)
            resp = (await conn.request(Code.CONTROLLER_HEARTBEAT, self._header(), timeout=REQUEST_TIMEOUT)).header
        except TransportError as e:
            conn = self._conns.pop(address, None)
            if conn is not None:
                await conn.close()
            self._set_state(address, "unreachable", str(e))
            return None
        except EQueueError as e:
            self._set_state(address, "failed", f"{e.code}: {e}")
            return None
        self._set_state(address, "ok", "")
        await self.apply(resp)
        return resp

    async def _connect(self, address: Address) -> BrokerConnection:
        """A connection to a name server, with the same settings the registrar uses for it."""
        return await BrokerConnection(address, link=self.link).connect()

    def _set_state(self, address: Address, state: str, error: str) -> None:
        if self._state.get(address) == state:
            return
        self._state[address] = state
        if state == "ok":
            log.info("controller heartbeats to %s answered", address)
        else:
            log.warning("controller heartbeat to %s: %s", address, error)

    # ------------------------------------------------------------ decisions

    async def apply(self, decision: dict[str, Any]) -> bool:
        """Do what the decision says unless it is stale or already done. True if something changed."""
        master_id, epoch = decision.get("master_id"), decision.get("epoch")
        if not isinstance(master_id, int) or not isinstance(epoch, int):
            return False  # the group has no master yet
        async with self._lock:
            st = self.status()
            if epoch < int(st["epoch"]):
                log.debug("ignoring a stale decision of epoch %d (this broker is at epoch %d)", epoch, st["epoch"])
                return False
            if master_id == self.broker_id:
                if st["role"] == "master" and st["epoch"] == epoch:
                    return False
                log.warning("controller: %s/%s id %d becomes master at epoch %d", self.cluster, self.name,
                            self.broker_id, epoch)
                await self._become_master(epoch)
            else:
                master = decision.get("master_address")
                if not isinstance(master, str):
                    return False
                if st["role"] == "replica" and st["epoch"] == epoch and st.get("master_address") == master:
                    return False
                log.warning("controller: %s/%s id %d becomes a replica of %s at epoch %d", self.cluster, self.name,
                            self.broker_id, master, epoch)
                await self._become_replica(master, epoch)
            self.decisions += 1
        if self.on_change is not None:
            self.on_change()
        return True

    async def _become_master(self, epoch: int) -> None:
        if self.replication is not None:
            await self.replication.become_master(epoch)
        else:
            self.own.role, self.own.epoch, self.own.master_address = "master", epoch, None

    async def _become_replica(self, master: str, epoch: int) -> None:
        if self.replication is not None:
            await self.replication.become_replica(master, epoch)
        else:
            self.own.role, self.own.epoch, self.own.master_address = "replica", epoch, master
