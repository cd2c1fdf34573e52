"""Routing over a cluster: topic routes from the name servers, one connection per broker.

The producer, the consumer and the admin client share this layer when they are given
`nameserver=` instead of `broker=` (RocketMQ's MQClientInstance + TopicPublishInfo). A route is
fetched from any name server (AsyncNameServerClient moves to the next on failure), cached for
`route_refresh_s` (30 s by default) and fetched again at once when a send or pull fails
(`route(topic, refresh=True)`). Connections to brokers open on first use and are dropped when a
request over them fails with a transport error, so a broker that returns gets a fresh one.

A broker name is a *group* (docs/replication.md): the route gives its master's address, where
sends and pulls go, and its replicas' addresses. While a group has no live master the name
servers route it read-only to a replica (RocketMQ's slave-read fallback); after a failover the
same name leads to the new master. A send refused with `not_master`, or failing on a dead
connection, refreshes the route at once (client/producer.py), so clients follow a new master
within a route fetch of the controller's decision, not after `route_refresh_s`.

Queues are named by `BrokerQueue(topic, broker, queue_id)`: queue ids are per broker. It is a
tuple, so the queue selectors and allocation strategies that choose among plain queue ids or
(topic, queue id) pairs choose among these unchanged, and sorting them is stable.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import NamedTuple

from equeue_core.client.connection import BrokerConnection
from equeue_core.client.fault import LatencyFaultTolerance
from equeue_core.contracts import TransportSettings
from equeue_core.errors import TransportError
from equeue_core.nameserver.routes import TopicRoute

DEFAULT_ROUTE_REFRESH_S = 30.0


class BrokerQueue(NamedTuple):
    """One queue of a topic on one broker."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:  # the consistent-hash ring key
        return f"{self.topic}@{self.broker}@{self.queue_id}"


@dataclass(slots=True)
class _Cached:
    route: TopicRoute
    fetched: float


class ClusterRouter:
    def __init__(self, nameserver: str, route_refresh_s: float = DEFAULT_ROUTE_REFRESH_S,
                 timeout: float = 5.0, settings: TransportSettings | None = None,
                 credentials: dict[str, str | None] | None = None,
                 fault: LatencyFaultTolerance | None = None) -> None:
        """`credentials`: for the name servers and the brokers alike (client/credentials.py).
        `fault`: the brokers a producer avoids for a while after failures (client/fault.py); the
        producer keeps it here, with the routes it chooses among."""
        # imported here: equeue_core.nameserver (loaded by config) imports equeue_core.client
        from equeue_core.client.nameserver import AsyncNameServerClient

        self.nameserver = nameserver  # as given (AsyncProducer.nameserver shows it)
        self.nameservers = AsyncNameServerClient(nameserver, timeout, credentials=credentials)
        self.route_refresh_s = route_refresh_s
        self.settings = settings or TransportSettings(connect_timeout=min(5.0, timeout))
        self.credentials = dict(credentials or {})
        self._routes: dict[str, _Cached] = {}
        self._addresses: dict[str, str] = {}  # broker name -> address (its master's), from the latest routes
        self._replicas: dict[str, tuple[str, ...]] = {}  # broker name -> its replicas' addresses
        self._conns: dict[str, BrokerConnection] = {}  # address -> connection
        self._connecting = asyncio.Lock()
        self.fault = fault if fault is not None else LatencyFaultTolerance()

    async def route(self, topic: str, refresh: bool = False) -> TopicRoute:
        """The topic's route, from the cache unless it is older than route_refresh_s or refresh.
        TopicNotFoundError when no live broker has the topic; TransportError when no name server
        answers (a cached route is then used if there is one)."""
        c = self._routes.get(topic)
        if c is None or refresh or time.monotonic() - c.fetched > self.route_refresh_s:
            try:
                route = await self.nameservers.get_route(topic)
            except TransportError:
                if c is None:
                    raise
                return c.route  # no name server answers: keep going on what we know
            for b in route.brokers:
                self._addresses[b.name] = b.address
                self._replicas[b.name] = b.replicas
            c = self._routes[topic] = _Cached(route, time.monotonic())
        return c.route

    def cached(self, topic: str) -> TopicRoute | None:
        c = self._routes.get(topic)
        return None if c is None else c.route

    def address_of(self, broker: str) -> str:
        try:
            return self._addresses[broker]
        except KeyError:
            raise TransportError(f"broker {broker!r} is in no route this client knows") from None

    def replicas_of(self, broker: str) -> tuple[str, ...]:
        """The addresses of the group's replicas, as the latest route gave them."""
        return self._replicas.get(broker, ())

    async def connection(self, broker: str) -> BrokerConnection:
        """The connection to broker `broker` (by name), opened on first use."""
        return await self.connection_to(self.address_of(broker))

    async def connection_to(self, address: str) -> BrokerConnection:
        conn = self._conns.get(address)
        if conn is None:
            async with self._connecting:
                conn = self._conns.get(address)
                if conn is None:
                    conn = await BrokerConnection(address, self.settings, **self.credentials).connect()
                    self._conns[address] = conn
        return conn

    async def forget_connection(self, broker: str) -> None:
        """Close the connection to a broker that failed, so the next request opens a new one."""
        address = self._addresses.get(broker)
        conn = self._conns.pop(address, None) if address else None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.close()
        await self.nameservers.close()


def writable_queues(route: TopicRoute) -> list[BrokerQueue]:
    return sorted(BrokerQueue(route.topic, b.name, q) for b in route.brokers if b.writable for q in range(b.queues))


def readable_queues(route: TopicRoute) -> list[BrokerQueue]:
    return sorted(BrokerQueue(route.topic, b.name, q) for b in route.brokers if b.readable for q in range(b.queues))
