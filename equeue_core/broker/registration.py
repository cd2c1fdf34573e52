"""BrokerRegistrar: keeps a broker registered with every name server (RocketMQ's registerBrokerAll).

One link per name server, each its own task, so a slow or dead name server never delays the
others. A link registers the broker's cluster, name, address and every topic with its queue count
every `register_interval_s`, and at once when a topic is created or deleted (`topics_changed`);
registrations carry a `data_version` (the time of the last topic change, strictly increasing) so a
name server can tell new topic data from a refresh. A name server that cannot be reached is retried
every interval; its outage is logged once (one warning when it goes, one info line when it is back),
not once per attempt. On a clean stop every name server gets UNREGISTER_BROKER.

Start-up rule (docs/cluster.md): the first round goes to every name server at once; if at least one
refused the name (another live broker of the cluster has it) and none accepted it, `start` raises
BrokerNameConflictError and the broker exits. Unreachable name servers do not stop a broker: like
RocketMQ's, it starts and keeps trying.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from equeue_core.broker.controller_agent import ControllerAgent, status_dict
from equeue_core.client.address import Address
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.credentials import ClientLink, client_link
from equeue_core.codes import Code
from equeue_core.contracts import TransportSettings
from equeue_core.errors import BrokerNameConflictError, EQueueError, TransportError
from equeue_core.nameserver.addresses import parse_nameservers
from equeue_core.nameserver.routes import PERM_READ_WRITE

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

log = logging.getLogger("equeue.broker.registration")

REQUEST_TIMEOUT = 5.0  # seconds a registration waits for a name server's answer
UNREGISTER_TIMEOUT = 3.0


def default_broker_name(port: int) -> str:
    """`<hostname>-<port>`: unique per host and port, stable across restarts (RocketMQ uses the hostname)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname() or "broker")[:100]
    return f"{host}-{port}"


def advertised_host(host: str) -> str:
    """The host other processes reach this broker at: a wildcard listen address is replaced by the
    address this host's name resolves to."""
    if host in ("", "0.0.0.0", "::"):
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return host


@dataclass
class NameServerLink:
    """The registrar's connection to one name server, and what that name server last answered."""

    address: Address
    conn: BrokerConnection | None = None
    state: str = "new"  # new | registered | unreachable | refused | failed
    last_error: str = ""
    registrations: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class BrokerRegistrar:
    def __init__(self, cluster: str, name: str, address: str, nameservers: list[Address],
                 interval_s: float, topics: Callable[[], dict[str, int]],
                 settings: TransportSettings | None = None, broker_id: int = 0, link: ClientLink | None = None,
                 status: Callable[[], dict[str, Any] | None] | None = None) -> None:
        """`status`: the broker's replication status as a dict (role, epoch, log_end), registered
        with the topics so routes can tell master from replicas; None = a lone master."""
        self.cluster = cluster
        self.name = name
        self.address = address
        self.broker_id = broker_id
        self._status = status
        self.agent: ControllerAgent | None = None  # in controller mode (config controller = true)
        self.interval_s = interval_s
        self._topics = topics
        self.settings = settings or TransportSettings(connect_timeout=REQUEST_TIMEOUT)
        self.link_settings = link or ClientLink(self.settings, None)  # TLS, CURVE, signing (client/credentials.py)
        self.links = [NameServerLink(a) for a in nameservers]
        self.data_version = int(time.time() * 1000)
        self._tasks: list[asyncio.Task] = []

    @classmethod
    def for_broker(cls, broker: Broker) -> BrokerRegistrar:
        """The registrar for a started broker, from its config (`nameserver`, `broker_name`, `cluster`,
        `register_interval_s`) and its bound address; topics are read live from its TopicRegistry."""
        cfg = broker.config
        host, port = broker.address
        nameservers = parse_nameservers(cfg.nameserver)
        for a in nameservers:  # an unknown scheme stops the broker now (PluginError lists the installed ones)
            broker.plugins.transport(a.transport)
        replication = getattr(broker, "replication", None)  # the data plane (docs/replication.md), if present
        registrar = cls(cfg.cluster, cfg.broker_name or default_broker_name(port),
                        f"{cfg.transport}://{advertised_host(host)}:{port}", nameservers,
                        cfg.register_interval_s, lambda: broker.topics.topics, broker_id=cfg.broker_id,
                        status=(lambda: status_dict(replication.status())) if replication is not None else None,
                        link=client_link(cfg, TransportSettings(connect_timeout=REQUEST_TIMEOUT)))
        if cfg.controller:
            registrar.agent = ControllerAgent.for_registrar(registrar, broker)
            registrar.agent.on_change = registrar.refresh
            registrar._status = registrar.agent.status
        return registrar

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Register with every name server once, then keep registering in the background.
        BrokerNameConflictError if the name was refused and accepted nowhere."""
        await asyncio.gather(*(self._register(link) for link in self.links))
        refused = [link for link in self.links if link.state == "refused"]
        if refused and not any(link.state == "registered" for link in self.links):
            await self._close_links()
            raise BrokerNameConflictError(refused[0].last_error)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(link)) for link in self.links]
        if self.agent is not None:
            self.agent.start()

    async def stop(self) -> None:
        """Stop registering and unregister from every name server that has the broker (best effort)."""
        if self.agent is not None:
            await self.agent.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.gather(*(self._unregister(link) for link in self.links if link.state == "registered"))
        await self._close_links()

    def refresh(self) -> None:
        """The broker's role changed: register with every name server now, so routes follow."""
        self.topics_changed()

    def topics_changed(self) -> None:
        """A topic was created or deleted: new data version, register with every name server now."""
        self.data_version = max(self.data_version + 1, int(time.time() * 1000))
        for link in self.links:
            link.wake.set()

    # ------------------------------------------------------------ one name server

    def _header(self) -> dict:
        h = {"cluster": self.cluster, "name": self.name, "address": self.address,
             "data_version": self.data_version, "broker_id": self.broker_id,
             "topics": {t: {"queues": n, "perm": PERM_READ_WRITE} for t, n in self._topics().items()}}
        st = self._status() if self._status is not None else None
        if st:
            h.update(role=st["role"], epoch=int(st["epoch"]), log_end=int(st["log_end"]))
        return h

    async def _run(self, link: NameServerLink) -> None:
        while True:
            try:
                await asyncio.wait_for(link.wake.wait(), self.interval_s)
            except TimeoutError:
                pass
            link.wake.clear()
            try:
                await self._register(link)
            except Exception:  # a bug must not end registration with this name server for good
                log.exception("registering with name server %s failed", link.address)

    async def _register(self, link: NameServerLink) -> None:
        try:
            if link.conn is None:
                link.conn = await BrokerConnection(link.address, link=self.link_settings).connect()
            resp = await link.conn.request(Code.REGISTER_BROKER, self._header(), timeout=REQUEST_TIMEOUT)
        except BrokerNameConflictError as e:
            self._set_state(link, "refused", str(e))
            return
        except TransportError as e:
            await self._drop_connection(link)
            self._set_state(link, "unreachable", str(e))
            return
        except EQueueError as e:
            self._set_state(link, "failed", f"{e.code}: {e}")
            return
        link.registrations += 1
        expiry = resp.header.get("expiry_s")
        if link.state != "registered" and isinstance(expiry, (int, float)) and expiry <= self.interval_s:
            log.warning("name server %s drops brokers after %ss of silence, but register_interval_s is %ss: "
                        "this broker will flap", link.address, expiry, self.interval_s)
        self._set_state(link, "registered", "")

    def _set_state(self, link: NameServerLink, state: str, error: str) -> None:
        """Log a change of a link's state once (not every retry of an outage)."""
        changed = state != link.state
        link.state, link.last_error = state, error
        if not changed:
            return
        who = f"{self.cluster}/{self.name} ({self.address})"
        if state == "registered":
            log.info("registered %s with name server %s", who, link.address)
        elif state == "unreachable":
            log.warning("name server %s unreachable, retrying every %ss: %s", link.address, self.interval_s, error)
        elif state == "refused":
            log.error("name server %s refused %s: %s", link.address, who, error)
        else:
            log.error("name server %s did not register %s: %s", link.address, who, error)

    async def _unregister(self, link: NameServerLink) -> None:
        if link.conn is None:
            return
        try:
            await link.conn.request(Code.UNREGISTER_BROKER, {"cluster": self.cluster, "name": self.name,
                                                             "address": self.address},
                                    timeout=UNREGISTER_TIMEOUT)
        except EQueueError as e:
            log.info("unregistering from name server %s failed (its connection close drops us anyway): %s",
                     link.address, e)

    async def _drop_connection(self, link: NameServerLink) -> None:
        conn, link.conn = link.conn, None
        if conn is not None:
            await conn.close()

    async def _close_links(self) -> None:
        for link in self.links:
            await self._drop_connection(link)
