"""RouteRegistry: which broker serves which topic, as the brokers last said (RocketMQ's RouteInfoManager).

Everything here comes from broker registrations and lives in memory only: a name server that
restarts knows nothing until the brokers register again (every `register_interval_s`). Brokers are
keyed by (cluster, name). A broker leaves when it unregisters, when the connection it registered
on closes, or when it has been silent for `expiry_s`; queries never show an expired broker even
before the periodic sweep removes it.

Not thread-safe: the name server calls it from its one event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from equeue_core.errors import BrokerNameConflictError, TopicNotFoundError
from equeue_core.nameserver.routes import BrokerRoute, BrokerSummary, ClusterInfo, TopicEntry, TopicRoute

log = logging.getLogger("equeue.nameserver")


@dataclass(slots=True)
class BrokerEntry:
    cluster: str
    name: str
    address: str
    topics: dict[str, TopicEntry]
    data_version: int
    connection_id: int | None  # the connection it registered on; its close drops the broker
    registered_at: float  # monotonic
    last_heartbeat: float  # monotonic


@dataclass(slots=True)
class RegistryStats:
    """Counters a metrics layer can read (all only grow)."""

    registrations: int = 0        # REGISTER_BROKER accepted (first ones and refreshes)
    joined: int = 0               # registrations that added a broker not listed before
    route_changes: int = 0        # registrations that changed a broker's topics or data version
    refused_conflicts: int = 0    # registrations refused: name taken in the cluster by another address
    unregistered: int = 0         # brokers removed by UNREGISTER_BROKER
    dropped_on_close: int = 0     # brokers removed because their connection closed
    expired: int = 0              # brokers removed after expiry_s of silence
    route_queries: int = 0
    route_misses: int = 0         # route queries for a topic no live broker has
    cluster_queries: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class RouteRegistry:
    """Brokers and their topics by (cluster, name). `clock` is injectable for tests of expiry."""

    expiry_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    brokers: dict[tuple[str, str], BrokerEntry] = field(default_factory=dict)
    stats: RegistryStats = field(default_factory=RegistryStats)

    def _alive(self, entry: BrokerEntry, now: float) -> bool:
        return now - entry.last_heartbeat < self.expiry_s

    def register(self, cluster: str, name: str, address: str, topics: dict[str, TopicEntry],
                 data_version: int, connection_id: int | None = None) -> BrokerEntry:
        """Add or refresh a broker. The same (cluster, name) from another address is refused while
        the broker holding it is alive (BrokerNameConflictError); from the same address it is the
        broker again (a restart, a new connection) and replaces the entry."""
        now = self.clock()
        key = (cluster, name)
        old = self.brokers.get(key)
        if old is not None and old.address != address and self._alive(old, now):
            self.stats.refused_conflicts += 1
            raise BrokerNameConflictError(
                f"broker name {name!r} in cluster {cluster!r} is taken by {old.address}; "
                f"give {address} another --name", cluster=cluster, name=name, holder=old.address)
        self.stats.registrations += 1
        if old is None or old.address != address or not self._alive(old, now):
            self.stats.joined += 1
            self.stats.route_changes += 1
            entry = BrokerEntry(cluster, name, address, topics, data_version, connection_id, now, now)
            self.brokers[key] = entry
            log.info("broker %s/%s at %s joined with %d topics", cluster, name, address, len(topics))
            return entry
        if old.data_version != data_version or old.topics != topics:
            self.stats.route_changes += 1
        old.topics = topics
        old.data_version = data_version
        old.connection_id = connection_id
        old.last_heartbeat = now
        return old

    def unregister(self, cluster: str, name: str, address: str) -> bool:
        """Remove the broker if it is the one at `address` (a stale unregister never removes a successor)."""
        entry = self.brokers.get((cluster, name))
        if entry is None or entry.address != address:
            return False
        del self.brokers[(cluster, name)]
        self.stats.unregistered += 1
        log.info("broker %s/%s at %s unregistered", cluster, name, address)
        return True

    def connection_lost(self, connection_id: int) -> list[BrokerEntry]:
        """Drop every broker whose latest registration came over this connection (RocketMQ's onChannelDestroy)."""
        gone = [e for e in self.brokers.values() if e.connection_id == connection_id]
        for e in gone:
            del self.brokers[(e.cluster, e.name)]
            self.stats.dropped_on_close += 1
            log.info("broker %s/%s at %s dropped: its connection closed", e.cluster, e.name, e.address)
        return gone

    def expire(self) -> list[BrokerEntry]:
        """Drop every broker silent for expiry_s or longer (RocketMQ's scanNotActiveBroker)."""
        now = self.clock()
        gone = [e for e in self.brokers.values() if not self._alive(e, now)]
        for e in gone:
            del self.brokers[(e.cluster, e.name)]
            self.stats.expired += 1
            log.warning("broker %s/%s at %s dropped: silent for %.1fs (broker_expiry_s %.1f)",
                        e.cluster, e.name, e.address, now - e.last_heartbeat, self.expiry_s)
        return gone

    def _live(self) -> list[BrokerEntry]:
        now = self.clock()
        return sorted((e for e in self.brokers.values() if self._alive(e, now)),
                      key=lambda e: (e.cluster, e.name))

    def route(self, topic: str) -> TopicRoute:
        """Every live broker that has the topic; TopicNotFoundError when none does."""
        self.stats.route_queries += 1
        brokers = [BrokerRoute(e.cluster, e.name, e.address, t.queues, t.perm)
                   for e in self._live() if (t := e.topics.get(topic)) is not None]
        if not brokers:
            self.stats.route_misses += 1
            raise TopicNotFoundError(f"topic {topic!r} has no route: no live broker registered it", topic=topic)
        return TopicRoute(topic, brokers)

    def cluster_info(self, count: bool = True) -> ClusterInfo:
        """Every live broker, sorted by (cluster, name). `count=False` for the metrics scrape,
        which is not a client's query."""
        if count:
            self.stats.cluster_queries += 1
        now = self.clock()
        return ClusterInfo([BrokerSummary(e.cluster, e.name, e.address, len(e.topics), e.data_version,
                                          round(now - e.last_heartbeat, 3), round(now - e.registered_at, 3))
                            for e in self._live()])
