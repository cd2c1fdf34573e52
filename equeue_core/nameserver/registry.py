"""RouteRegistry: which broker serves which topic, as the brokers last said (RocketMQ's RouteInfoManager).

Everything here comes from broker registrations and lives in memory only: a name server that
restarts knows nothing until the brokers register again (every `register_interval_s`). Brokers are
keyed by (cluster, name, broker_id): the brokers sharing a name form a *group* (one master and its
replicas, docs/replication.md), told apart by their `--broker-id`. A broker leaves when it unregisters, when the connection it registered
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
from equeue_core.nameserver.routes import (
    PERM_WRITE,
    BrokerRoute,
    BrokerSummary,
    ClusterInfo,
    TopicEntry,
    TopicRoute,
)

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
    broker_id: int = 0
    role: str = "master"  # as the broker last said (its replication status; "master" without replication)
    epoch: int = 0
    log_end: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.cluster, self.name, self.broker_id)


@dataclass(slots=True)
class RegistryStats:
    """Counters a metrics layer can read (all only grow)."""

    registrations: int = 0        # REGISTER_BROKER accepted (first ones and refreshes)
    joined: int = 0               # registrations that added a broker not listed before
    route_changes: int = 0        # registrations that changed a broker's topics or data version
    refused_conflicts: int = 0    # registrations refused: (name, broker id) taken in the cluster by another address
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
    """Brokers and their topics by (cluster, name, broker_id). `clock` is injectable for tests of
    expiry. `master_of(cluster, name)`, when set (the name server's controller, docs/controller.md),
    names the broker id that is the group's master; otherwise the master is the live member that
    registered with role "master" (the highest epoch if several say so)."""

    expiry_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    brokers: dict[tuple[str, str, int], BrokerEntry] = field(default_factory=dict)
    stats: RegistryStats = field(default_factory=RegistryStats)
    master_of: Callable[[str, str], int | None] | None = None

    def _alive(self, entry: BrokerEntry, now: float) -> bool:
        return now - entry.last_heartbeat < self.expiry_s

    def register(self, cluster: str, name: str, address: str, topics: dict[str, TopicEntry],
                 data_version: int, connection_id: int | None = None, broker_id: int = 0,
                 role: str = "master", epoch: int = 0, log_end: int = 0) -> BrokerEntry:
        """Add or refresh a broker. The same (cluster, name, broker_id) from another address is
        refused while the broker holding it is alive (BrokerNameConflictError); from the same
        address it is the broker again (a restart, a new connection) and replaces the entry."""
        now = self.clock()
        key = (cluster, name, broker_id)
        old = self.brokers.get(key)
        if old is not None and old.address != address and self._alive(old, now):
            self.stats.refused_conflicts += 1
            raise BrokerNameConflictError(
                f"broker name {name!r} in cluster {cluster!r} is taken by {old.address}; give {address} "
                f"another --name or another --broker-id than {broker_id}",
                cluster=cluster, name=name, broker_id=broker_id, holder=old.address)
        self.stats.registrations += 1
        if old is None or old.address != address or not self._alive(old, now):
            self.stats.joined += 1
            self.stats.route_changes += 1
            entry = BrokerEntry(cluster, name, address, topics, data_version, connection_id, now, now,
                                broker_id, role, epoch, log_end)
            self.brokers[key] = entry
            log.info("broker %s/%s id %d at %s joined as %s with %d topics", cluster, name, broker_id, address,
                     role, len(topics))
            return entry
        if old.data_version != data_version or old.topics != topics or old.role != role:
            self.stats.route_changes += 1
        old.topics = topics
        old.data_version = data_version
        old.connection_id = connection_id
        old.last_heartbeat = now
        old.role, old.epoch, old.log_end = role, epoch, log_end
        return old

    def unregister(self, cluster: str, name: str, address: str) -> bool:
        """Remove the group member at `address` (a stale unregister never removes a successor)."""
        entry = next((e for e in self.brokers.values() if (e.cluster, e.name, e.address) == (cluster, name, address)),
                     None)
        if entry is None:
            return False
        del self.brokers[entry.key]
        self.stats.unregistered += 1
        log.info("broker %s/%s at %s unregistered", cluster, name, address)
        return True

    def connection_lost(self, connection_id: int) -> list[BrokerEntry]:
        """Drop every broker whose latest registration came over this connection (RocketMQ's onChannelDestroy)."""
        gone = [e for e in self.brokers.values() if e.connection_id == connection_id]
        for e in gone:
            del self.brokers[e.key]
            self.stats.dropped_on_close += 1
            log.info("broker %s/%s at %s dropped: its connection closed", e.cluster, e.name, e.address)
        return gone

    def expire(self) -> list[BrokerEntry]:
        """Drop every broker silent for expiry_s or longer (RocketMQ's scanNotActiveBroker)."""
        now = self.clock()
        gone = [e for e in self.brokers.values() if not self._alive(e, now)]
        for e in gone:
            del self.brokers[e.key]
            self.stats.expired += 1
            log.warning("broker %s/%s at %s dropped: silent for %.1fs (broker_expiry_s %.1f)",
                        e.cluster, e.name, e.address, now - e.last_heartbeat, self.expiry_s)
        return gone

    def _live(self) -> list[BrokerEntry]:
        now = self.clock()
        return sorted((e for e in self.brokers.values() if self._alive(e, now)),
                      key=lambda e: (e.cluster, e.name, e.broker_id))

    def groups(self) -> dict[tuple[str, str], list[BrokerEntry]]:
        """The live members of every group, by (cluster, name), each list sorted by broker id."""
        out: dict[tuple[str, str], list[BrokerEntry]] = {}
        for e in self._live():
            out.setdefault((e.cluster, e.name), []).append(e)
        return out

    def master(self, members: list[BrokerEntry]) -> BrokerEntry | None:
        """The group's live master: the one the controller names, else the member that says it is
        master (the highest epoch wins); None while the group has none (reads go to replicas)."""
        if not members:
            return None
        if self.master_of is not None:
            chosen = self.master_of(members[0].cluster, members[0].name)
            if chosen is not None:
                return next((e for e in members if e.broker_id == chosen), None)
        masters = [e for e in members if e.role == "master"]
        return max(masters, key=lambda e: (e.epoch, -e.broker_id)) if masters else None

    def _group_route(self, members: list[BrokerEntry], topic: str) -> BrokerRoute | None:
        """One group's part of a route: its master's address (sends), its replicas' addresses (pull
        fallback). A live master is the front for every topic of the group, even one its latest
        registration does not list yet (a replica that synced the topic first must not draw readers
        away from the master). With no live master the first replica stands in, read-only."""
        having = [e for e in members if topic in e.topics]
        if not having:
            return None
        master = self.master(members)
        if master is not None:
            front, entry = master, (master.topics.get(topic) or having[0].topics[topic])
            perm = entry.perm
        else:
            front, entry = having[0], having[0].topics[topic]
            perm = entry.perm & ~PERM_WRITE
        replicas = tuple(e.address for e in having if e is not front)
        return BrokerRoute(front.cluster, front.name, front.address, entry.queues, perm, replicas, front is master)

    def route(self, topic: str) -> TopicRoute:
        """Every live group that has the topic; TopicNotFoundError when none does."""
        self.stats.route_queries += 1
        brokers = [r for members in self.groups().values() if (r := self._group_route(members, topic)) is not None]
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
                                          round(now - e.last_heartbeat, 3), round(now - e.registered_at, 3),
                                          e.broker_id, e.role, e.epoch, e.log_end)
                            for e in self._live()])
