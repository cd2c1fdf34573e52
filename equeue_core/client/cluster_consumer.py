"""A consumer over every broker of a cluster: `Consumer(group, nameserver="h:p,h:p")`.

It runs one part per broker that holds a subscribed topic: a plain AsyncConsumer connected to that
broker, which heartbeats the group there, pulls that broker's queues and commits their offsets to
that broker (offsets live on the broker that owns the queue). The queues themselves are decided
here, over all brokers at once (RocketMQ's RebalanceImpl):

- the topics' routes come from the name servers (client/routing.py), cached for route_refresh_s
  and fetched again at once when a part's pull fails;
- group membership is per broker, as in RocketMQ: every member heartbeats every broker that has
  one of its topics, so every broker knows the same members; the members used are the union of
  what the parts' brokers answered, so a member one broker missed (it just returned) still counts;
- every readable queue of every live broker becomes a `BrokerQueue(topic, broker, queue_id)`, and
  the group's allocation strategy shares the sorted list among the sorted members, so every member
  computes the same split; broadcasting takes them all;
- a broker group is pulled at the address its route gives: its master, or while it has none a
  replica (RocketMQ's slave-read fallback); when that address changes (failover, the master back)
  the part is restarted there from the offsets committed on it;
- a broker that leaves the route (it died: the name servers drop it at once) has its part closed:
  the others go on; when it is back in the route a new part starts its queues from the offsets
  committed on it, so what was handled but not committed is delivered again (at least once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from equeue_core.broker.topics import RETRY_PREFIX
from equeue_core.client.consumer import AsyncConsumer, parse_expression
from equeue_core.client.credentials import CREDENTIALS
from equeue_core.client.process_queue import ProcessQueue
from equeue_core.client.routing import DEFAULT_ROUTE_REFRESH_S, BrokerQueue, ClusterRouter, readable_queues
from equeue_core.codes import Code
from equeue_core.errors import ConfigError, EQueueError, TopicNotFoundError, TransportError
from equeue_core.nameserver.routes import TopicRoute
from equeue_core.plugins import get_plugin_manager

log = logging.getLogger("equeue.consumer")


class AsyncClusterConsumer:
    def __init__(self, group: str, nameserver: str, *, route_refresh_s: float = DEFAULT_ROUTE_REFRESH_S,
                 client_id: str | None = None, **options: Any) -> None:
        self.group = group
        self.mode = options.get("mode", "clustering")
        if self.mode not in ("clustering", "broadcasting"):
            raise ConfigError(f"mode must be 'clustering' or 'broadcasting', not {self.mode!r}")
        self.strategy = get_plugin_manager().allocation_strategy(options.get("allocation", "averagely"))
        self.rebalance_interval = float(options.get("rebalance_interval", 20.0))
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.options = options
        self.router = ClusterRouter(nameserver, route_refresh_s,
                                    credentials={k: options.get(k) for k in CREDENTIALS})
        self.subscriptions: dict[str, str] = {}
        self.parts: dict[str, AsyncConsumer] = {}  # broker name -> its part
        self._handler: Callable[..., Any] | None = None
        self._lock = asyncio.Lock()
        self._running = False
        self._background: asyncio.Task | None = None
        self._soon: asyncio.TimerHandle | None = None  # the next rebalance_soon's timer
        self._soon_refresh = False  # ... and whether it fetches the routes again
        self._rebalancing: set[asyncio.Task] = set()  # the rebalances rebalance_soon started
        self._closed_stats: Counter[str] = Counter()

    def subscribe(self, topic: str, expression: str = "*") -> AsyncClusterConsumer:
        parse_expression(expression)  # a bad expression fails here, not in every part
        self.subscriptions[topic] = expression or "*"
        return self

    def _topics(self) -> list[str]:
        topics = list(self.subscriptions)
        if self.mode == "clustering":
            topics.append(RETRY_PREFIX + self.group)
        return topics

    @property
    def queues(self) -> dict[BrokerQueue, ProcessQueue]:
        return {BrokerQueue(t, name, q): pq for name, part in self.parts.items() for (t, q), pq in part.queues.items()}

    @property
    def stats(self) -> dict[str, int]:
        total = Counter(self._closed_stats)
        for part in self.parts.values():
            total.update(part.stats)
        return dict(total)

    async def start(self, handler: Callable[..., Any]) -> AsyncClusterConsumer:
        if not self.subscriptions:
            raise ConfigError("subscribe to at least one topic before start()")
        self._handler = handler
        self._running = True
        for topic in self.subscriptions:  # a topic no broker has is one clear error at start
            await self.router.route(topic)
        await self.rebalance()
        self._background = asyncio.get_running_loop().create_task(self._every())
        return self

    async def _every(self) -> None:
        while self._running:
            await asyncio.sleep(min(self.rebalance_interval, self.router.route_refresh_s))
            try:
                await self.rebalance()
            except asyncio.CancelledError:
                raise
            except EQueueError as e:
                log.warning("rebalance failed: %s", e)
            except Exception:
                log.exception("rebalance failed")

    def broker_failed(self, part: AsyncConsumer) -> None:
        """A part's pull failed with a transport error: fetch the routes again soon (debounced),
        so a dead broker's part is closed and the others' share is recomputed."""
        self.rebalance_soon(0.5, refresh=True)

    def rebalance_soon(self, delay: float = 0.0, refresh: bool = False) -> None:
        """Rebalance every part `delay` seconds from now, once for all the calls until then (the
        earliest time wins; `refresh` if any asked for it). A part asks here rather than
        rebalancing in a task of its own, because a rebalance may close the part that asked, and
        a part's close waits for its own tasks: the rebalance runs in a task this consumer owns,
        which close() ends."""
        if not self._running:
            return
        loop = asyncio.get_running_loop()
        self._soon_refresh |= refresh
        if self._soon is not None:
            if self._soon.when() <= loop.time() + delay:
                return
            self._soon.cancel()

        def fire() -> None:
            self._soon = None
            refresh, self._soon_refresh = self._soon_refresh, False
            task = loop.create_task(self._safe_rebalance(refresh))
            self._rebalancing.add(task)
            task.add_done_callback(self._rebalancing.discard)

        self._soon = loop.call_later(delay, fire)

    async def _safe_rebalance(self, refresh: bool = False) -> None:
        try:
            await self.rebalance(refresh)
        except EQueueError as e:
            log.warning("rebalance failed: %s", e)

    async def _routes(self, refresh: bool) -> dict[str, TopicRoute]:
        routes: dict[str, TopicRoute] = {}
        for topic in self._topics():
            try:
                routes[topic] = await self.router.route(topic, refresh)
            except TopicNotFoundError:
                continue  # e.g. no retry topic yet
        return routes

    async def rebalance(self, refresh: bool = False) -> None:
        """Fetch routes (cached unless stale or refresh), start a part for each broker that
        appeared, close the parts of brokers that left, and give every part its share."""
        if not self._running:
            return
        async with self._lock:
            if not self._running:  # close() came first: it closes the parts
                return
            routes = await self._routes(refresh)
            brokers: dict[str, str] = {}
            for r in routes.values():  # one address per group: its master's wherever a route names it
                for b in r.brokers:
                    if b.readable and (b.is_master or b.name not in brokers):
                        brokers[b.name] = b.address
            for name in sorted(set(self.parts) - set(brokers)):
                await self._close_part(name)
            for name in sorted(n for n, part in self.parts.items() if part.broker != brokers[n]):
                # the group's master changed, or it died and a replica serves reads (or the master is back)
                await self._close_part(name, why=f"its route moved to {brokers[name]}")
            for name in sorted(set(brokers) - set(self.parts)):
                await self._start_part(name, brokers[name])
            members = await self._members()
            wanted: set[BrokerQueue] = set()
            for route in routes.values():
                queues = [q for q in readable_queues(route) if q.broker in self.parts]
                if self.mode == "broadcasting":
                    wanted.update(queues)
                else:
                    wanted.update(self.strategy(self.client_id, queues, members))
            for name, part in self.parts.items():
                async with part._rebalance_lock:
                    await part._apply({(q.topic, q.queue_id) for q in wanted if q.broker == name})

    async def _members(self) -> list[str]:
        """The group's members: the union of what every part's broker says (GROUP_MEMBERS), or
        what its last heartbeat said if it does not answer now. Always includes this client."""
        members = {self.client_id}
        if self.mode != "clustering":
            return sorted(members)
        for part in list(self.parts.values()):
            try:
                assert part._conn is not None
                part._members = (await part._conn.request(Code.GROUP_MEMBERS, {"group": self.group},
                                                          timeout=5.0)).header["members"]
            except TransportError as e:
                log.warning("group members from %s: %s", part.broker, e)
            members.update(part._members)
        return sorted(members)

    async def _start_part(self, name: str, address: str) -> None:
        options = dict(self.options)
        if self.mode == "broadcasting":  # local offsets are keyed topic:queue_id, so one file per broker
            options["offset_dir"] = os.path.join(options.get("offset_dir", ".equeue-offsets"), name)
        part = AsyncConsumer(self.group, address, client_id=self.client_id, **options)
        part.coordinator = self
        for topic, expression in self.subscriptions.items():
            part.subscribe(topic, expression)
        assert self._handler is not None
        try:
            await part.start(self._handler)
        except TransportError as e:  # in the route but not reachable (yet): try at the next rebalance
            log.warning("broker %s (%s) unreachable: %s", name, address, e)
            await part.close(drain_timeout=0)
            if part._pool is not None:  # created before the connection failed; close() skips it
                part._pool.shutdown(wait=False)
            return
        self.parts[name] = part
        log.info("%s joined group %s on broker %s (%s)", self.client_id, self.group, name, address)

    async def _close_part(self, name: str, drain_timeout: float = 5.0, why: str = "no longer in the route") -> None:
        part = self.parts.pop(name)
        try:
            await part.close(drain_timeout)
        finally:  # after the drain: what the handler finished while closing counts too
            self._closed_stats.update(part.stats)
        log.info("%s left broker %s (%s)", self.client_id, name, why)

    async def commit(self) -> None:
        for part in list(self.parts.values()):
            try:
                await part.commit()
            except TransportError as e:
                log.warning("commit failed: %s", e)

    def stop_handling(self) -> None:
        for part in list(self.parts.values()):
            part.stop_handling()

    async def close(self, drain_timeout: float = 30.0) -> None:
        if not self._running:
            return
        self._running = False
        if self._soon is not None:
            self._soon.cancel()
        # A rebalance in progress ends first, under the lock: cancelled midway it could leave a
        # part closed halfway, or started and in no one's hands. The ones waiting end here.
        async with self._lock:
            waiting = [t for t in (self._background, *self._rebalancing) if t is not None]
            for t in waiting:
                t.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            for name in sorted(self.parts):
                await self._close_part(name, drain_timeout, "closing")
        await self.router.close()
