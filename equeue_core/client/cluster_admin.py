"""Admin over a cluster: `AdminClient(nameserver="h:p,h:p")`.

The brokers come from the name servers (GET_CLUSTER_INFO); each call asks the brokers concerned
through a plain single-broker AsyncAdminClient per broker and answers **per broker**: a map of
broker name -> what that broker answered (queue ids, offsets and lag are per broker). A message id
carries its broker's host:port (equeue_core/msgid.py), so `get_message` asks that broker only; a
key lookup asks every broker that has the topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from equeue_core import msgid
from equeue_core.client.credentials import credentials as client_credentials
from equeue_core.client.message import ReceivedMessage
from equeue_core.client.nameserver import AsyncNameServerClient
from equeue_core.errors import ConfigError, EQueueError, TopicNotFoundError, TransportError
from equeue_core.nameserver.routes import BrokerSummary

log = logging.getLogger("equeue.admin")

ROUTE_WAIT_S = 10.0  # create_topic waits at most this long for the name servers to route a new topic
ROUTE_POLL_S = 0.02


class AsyncClusterAdminClient:
    def __init__(self, nameserver: str, **credentials: str | None) -> None:
        """`credentials`: as for AsyncAdminClient (client/credentials.py); the name servers get them too."""
        self.nameserver = nameserver
        self._credentials = client_credentials(**credentials)
        self.nameservers = AsyncNameServerClient(nameserver, credentials=self._credentials)
        self._admins: dict[str, Any] = {}  # broker address -> AsyncAdminClient

    async def start(self) -> AsyncClusterAdminClient:
        await self.nameservers.cluster_info()  # no name server reachable: one clear error now
        return self

    async def brokers(self, cluster: str | None = None, names: list[str] | None = None) -> list[BrokerSummary]:
        """The live brokers (of one cluster, or the named ones), one per broker group: its master
        (replicas get topics and offsets from it, docs/replication.md), or while it has none the
        replica that stands in; ConfigError for an unknown name."""
        live = (await self.nameservers.cluster_info()).fronts()
        if cluster:
            live = [b for b in live if b.cluster == cluster]
        if names:
            unknown = sorted(set(names) - {b.name for b in live})
            if unknown:
                raise ConfigError(f"no live broker named {', '.join(unknown)}; live: "
                                  + (", ".join(b.name for b in live) or "none"))
            live = [b for b in live if b.name in names]
        return live

    async def on(self, address: str) -> Any:
        """The single-broker AsyncAdminClient of the broker at `address` (opened once)."""
        from equeue_core.client.admin import AsyncAdminClient

        admin = self._admins.get(address)
        if admin is None:
            admin = self._admins[address] = await AsyncAdminClient(address, **self._credentials).start()
        return admin

    async def _each(self, brokers: list[BrokerSummary], method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        async def one(b: BrokerSummary) -> Any:
            return await getattr(await self.on(b.address), method)(*args, **kwargs)

        results = await asyncio.gather(*(one(b) for b in brokers), return_exceptions=True)
        out: dict[str, Any] = {}
        for b, r in zip(brokers, results, strict=True):
            if isinstance(r, BaseException) and not isinstance(r, EQueueError):
                raise r
            out[b.name] = r
        return out

    async def _topic_brokers(self, topic: str) -> list[BrokerSummary]:
        route = await self.nameservers.get_route(topic)
        names = {b.name for b in route.brokers}
        return [b for b in await self.brokers() if b.name in names]

    async def create_topic(self, topic: str, queues: int | None = None, brokers: list[str] | None = None,
                           cluster: str | None = None) -> dict[str, Any]:
        """Create the topic on every live broker (of `cluster`), or on the named `brokers`. Returns
        once every name server that answers routes the topic to every broker that created it, so
        a producer's or consumer's first route lookup right after finds it (a broker registers a
        new topic in the background, docs/cluster.md); after ROUTE_WAIT_S without that, a warning
        says which name server does not route it yet, and the result is returned all the same."""
        targets = await self.brokers(cluster, brokers)
        if not targets:
            raise ConfigError("no live broker to create the topic on")
        created = await self._each(targets, "create_topic", topic, queues)
        await self._routed(topic, {name for name, r in created.items() if not isinstance(r, BaseException)})
        return created

    async def _routed(self, topic: str, names: set[str]) -> None:
        """Wait (up to ROUTE_WAIT_S) until every name server that answers routes `topic` to `names`."""
        if not names:
            return
        missing = list(self.nameservers.addresses)
        deadline = time.monotonic() + ROUTE_WAIT_S
        while True:
            still = []
            for address in missing:
                try:
                    route = await self.nameservers.route_at(address, topic)
                except TopicNotFoundError:
                    still.append(address)
                    continue
                except TransportError:
                    continue  # not reachable: it learns the route from the brokers' registrations when back
                if not names <= {b.name for b in route.brokers}:
                    still.append(address)
            missing = still
            if not missing:
                return
            if time.monotonic() >= deadline:
                log.warning("topic %r created on %s, but name server(s) %s do not route it yet after %.0f s",
                            topic, ", ".join(sorted(names)), ", ".join(str(a) for a in missing), ROUTE_WAIT_S)
                return
            await asyncio.sleep(ROUTE_POLL_S)

    async def delete_topic(self, topic: str) -> dict[str, Any]:
        return await self._each(await self._topic_brokers(topic), "delete_topic", topic)

    async def topics(self, system: bool = False) -> dict[str, Any]:
        return await self._each(await self.brokers(), "topics", system)

    async def queue_ranges(self, topic: str) -> dict[str, Any]:
        return await self._each(await self._topic_brokers(topic), "queue_ranges", topic)

    async def groups(self, group: str | None = None) -> dict[str, Any]:
        return await self._each(await self.brokers(), "groups", group)

    async def reset_offsets(self, group: str, topic: str, to: str | int) -> dict[str, Any]:
        return await self._each(await self._topic_brokers(topic), "reset_offsets", group, topic, to)

    async def stats(self) -> dict[str, Any]:
        return await self._each(await self.brokers(), "stats")

    async def broker_info(self) -> dict[str, Any]:
        return await self._each(await self.brokers(), "broker_info")

    async def get_message(self, msg_id: str) -> ReceivedMessage:
        """Straight to the broker the id names (its host:port), with that broker's transport."""
        host, port, _ = msgid.decode(msg_id)
        scheme = "tcp"
        for b in (await self.nameservers.cluster_info()).brokers:  # every member: the id may name a replica
            if b.address.endswith(f"://{host}:{port}"):
                scheme = b.address.split("://", 1)[0]
        return await (await self.on(f"{scheme}://{host}:{port}")).get_message(msg_id)

    async def find_by_key(self, topic: str, key: str, max_results: int = 32,
                          scan_limit: int = 100_000) -> list[ReceivedMessage]:
        """Every broker that has the topic is asked; results newest first over all of them."""
        found = await self._each(await self._topic_brokers(topic), "find_by_key", topic, key, max_results, scan_limit)
        msgs = [m for r in found.values() if not isinstance(r, TopicNotFoundError) for m in _raise_or(r)]
        msgs.sort(key=lambda m: m.store_ts, reverse=True)
        return msgs[:max_results]

    async def close(self) -> None:
        admins, self._admins = list(self._admins.values()), {}
        for a in admins:
            await a.close()
        await self.nameservers.close()


def _raise_or(r: Any) -> Any:
    if isinstance(r, BaseException):
        raise r
    return r
