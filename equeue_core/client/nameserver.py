"""NameServerClient: ask name servers for routes and the brokers of a cluster.

Give it every name server (`"host:port,host:port"`); it keeps one connection to the one it is
using (picked at random at start, so clients spread over name servers) and moves to the next on a
transport failure, like RocketMQ's client. Name servers are independent and may briefly disagree
(one just restarted knows nothing until the brokers register again), so a topic one of them does
not know is asked of the others before `TopicNotFoundError` is raised. When no name server can be
reached the error is one `TransportError` naming each and why.

The routing producer, consumer and admin client build on it (client/routing.py, docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

from equeue_core.client.address import Address
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.credentials import ClientLink, client_link
from equeue_core.client.loop import background_loop, run_sync
from equeue_core.codes import Code
from equeue_core.contracts import TransportSettings
from equeue_core.errors import NotLeaderError, TopicNotFoundError, TransportError
from equeue_core.nameserver.addresses import parse_nameservers
from equeue_core.nameserver.routes import ClusterInfo, TopicRoute

DEFAULT_TIMEOUT = 5.0


class AsyncNameServerClient:
    def __init__(self, nameserver: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT,
                 settings: TransportSettings | None = None, *, credentials: Mapping[str, str | None] | None = None,
                 link: ClientLink | None = None) -> None:
        """`credentials` (client/credentials.py) or a ready `link` (a broker's own, from its config)."""
        text = nameserver if isinstance(nameserver, str) else ",".join(nameserver)
        self.addresses: list[Address] = parse_nameservers(text)
        self.timeout = timeout
        self.link = link or client_link(credentials, settings or TransportSettings(connect_timeout=min(5.0, timeout)))
        self.settings = self.link.settings
        self._conns: dict[Address, BrokerConnection] = {}
        self._current = random.randrange(len(self.addresses))
        self._connecting = asyncio.Lock()

    async def start(self) -> AsyncNameServerClient:
        """Nothing to do up front: connections open on first use (a name server down at start is
        simply skipped then)."""
        return self

    async def _connection(self, address: Address) -> BrokerConnection:
        conn = self._conns.get(address)
        if conn is None:
            async with self._connecting:  # concurrent callers share one connection per name server
                conn = self._conns.get(address)
                if conn is None:
                    conn = await BrokerConnection(address, link=self.link).connect()
                    self._conns[address] = conn
        return conn

    async def _ask(self, address: Address, code: int, header: dict[str, Any]) -> dict[str, Any]:
        conn = await self._connection(address)
        return (await conn.request(code, header, timeout=self.timeout)).header

    async def request(self, code: int, header: dict[str, Any] | None = None,
                      retry_on_not_found: bool = False) -> dict[str, Any]:
        """Ask the current name server; on a transport failure (or, with retry_on_not_found, a
        TopicNotFoundError) ask the next, each at most once. The one that answers becomes current."""
        failures: list[str] = []
        kinds: set[type[TransportError]] = set()
        not_found: TopicNotFoundError | None = None
        n = len(self.addresses)
        for i in range(n):
            idx = (self._current + i) % n
            address = self.addresses[idx]
            try:
                result = await self._ask(address, code, header or {})
            except TransportError as e:
                failures.append(f"{address}: {e}")
                kinds.add(type(e))
                conn = self._conns.pop(address, None)
                if conn is not None:
                    await conn.close()
                continue
            except TopicNotFoundError as e:
                if not retry_on_not_found:
                    raise
                not_found = not_found or e
                continue
            self._current = idx
            return result
        if not_found is not None:
            raise not_found
        # every name server refused the same way (tls_required, handshake_refused): keep that type
        kind = kinds.pop() if len(kinds) == 1 else TransportError
        raise kind("no name server reachable: " + "; ".join(failures))

    async def get_route(self, topic: str) -> TopicRoute:
        """Every live broker that has `topic`, with its queue count and permission.
        TopicNotFoundError when no reachable name server knows a broker with it."""
        return TopicRoute.from_wire(await self.request(Code.GET_ROUTE, {"topic": topic}, retry_on_not_found=True))

    async def route_at(self, address: Address, topic: str) -> TopicRoute:
        """`topic`'s route as the name server at `address` alone sees it (no failover):
        TopicNotFoundError when it knows no broker with it, TransportError when it is not reachable."""
        return TopicRoute.from_wire(await self._ask(address, Code.GET_ROUTE, {"topic": topic}))

    async def cluster_info(self) -> ClusterInfo:
        """Every live broker the current name server knows (cluster, name, address, topics, ages)."""
        return ClusterInfo.from_wire(await self.request(Code.GET_CLUSTER_INFO))

    async def info(self) -> dict[str, Any]:
        """The current name server's address, version, expiry_s, broker count and counters."""
        return await self.request(Code.NAMESERVER_INFO)

    async def leader_request(self, code: int, header: dict[str, Any] | None = None) -> dict[str, Any]:
        """A controller request only the Raft leader answers (ELECT_MASTER): each name server is
        asked in turn until one is the leader. NotLeaderError when none is (an election is running,
        or no majority is up), TransportError when none answers."""
        failures: list[str] = []
        not_leader: NotLeaderError | None = None
        for address in self.addresses:
            try:
                return await self._ask(address, code, header or {})
            except NotLeaderError as e:
                not_leader = e
            except TransportError as e:
                failures.append(f"{address}: {e}")
                conn = self._conns.pop(address, None)
                if conn is not None:
                    await conn.close()
        if not_leader is not None:
            raise NotLeaderError(f"no name server's controller is the Raft leader now ({not_leader})")
        raise TransportError("no name server reachable: " + "; ".join(failures))

    async def controller_info(self) -> dict[str, Any]:
        """The controller's view (CONTROLLER_INFO): Raft state and every group's master, epoch,
        members, in-sync set and lag. Asked of the leader when one answers, else of any."""
        return await self._leader_info()

    async def _leader_info(self) -> dict[str, Any]:
        first: dict[str, Any] | None = None
        failures: list[str] = []
        for address in self.addresses:
            try:
                info = await self._ask(address, Code.CONTROLLER_INFO, {})
            except TransportError as e:
                failures.append(f"{address}: {e}")
                conn = self._conns.pop(address, None)
                if conn is not None:
                    await conn.close()
                continue
            if info.get("state") == "leader":
                return info
            first = first or info
        if first is not None:
            return first
        raise TransportError("no name server reachable: " + "; ".join(failures))

    async def elect_master(self, cluster: str, name: str, broker_id: int | None = None) -> dict[str, Any]:
        """Move the group's mastership by hand (to `broker_id`, an in-sync member; or to the best
        in-sync member). FailoverRefusedError with the reason when it may not."""
        header: dict[str, Any] = {"cluster": cluster, "name": name}
        if broker_id is not None:
            header["broker_id"] = broker_id
        return await self.leader_request(Code.ELECT_MASTER, header)

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.close()

    async def __aenter__(self) -> AsyncNameServerClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class NameServerClient:
    """Blocking NameServerClient; every method mirrors AsyncNameServerClient."""

    def __init__(self, nameserver: str | Sequence[str], timeout: float = DEFAULT_TIMEOUT,
                 **credentials: str | None) -> None:
        background_loop()
        self._async = AsyncNameServerClient(nameserver, timeout, credentials=credentials)

    @property
    def addresses(self) -> list[Address]:
        return self._async.addresses

    def get_route(self, topic: str) -> TopicRoute:
        return run_sync(self._async.get_route(topic))

    def cluster_info(self) -> ClusterInfo:
        return run_sync(self._async.cluster_info())

    def info(self) -> dict[str, Any]:
        return run_sync(self._async.info())

    def controller_info(self) -> dict[str, Any]:
        return run_sync(self._async.controller_info())

    def elect_master(self, cluster: str, name: str, broker_id: int | None = None) -> dict[str, Any]:
        return run_sync(self._async.elect_master(cluster, name, broker_id))

    def close(self) -> None:
        run_sync(self._async.close())

    def __enter__(self) -> NameServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
