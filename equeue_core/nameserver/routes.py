"""What a name server knows and answers, as plain values shared by the server and its clients.

One definition for both ends: the registry builds these, `to_wire` turns them into the msgpack
maps of docs/protocol.md (codes 40-44), and the client's `from_wire` turns them back.
Permissions are RocketMQ's PermName bits: 4 read, 2 write (6 = read and write).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from equeue_core.errors import ConfigError, ProtocolError

PERM_READ = 4
PERM_WRITE = 2
PERM_READ_WRITE = PERM_READ | PERM_WRITE
DEFAULT_CLUSTER = "DefaultCluster"
BROKER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,127}$")


def check_broker_name(kind: str, value: object) -> str:
    """A broker or cluster name: 1-127 chars of [A-Za-z0-9_.-] (ConfigError otherwise)."""
    if not isinstance(value, str) or not BROKER_NAME.match(value):
        raise ConfigError(f"{kind} {value!r} must be 1-127 characters of [A-Za-z0-9_.-]")
    return value


@dataclass(frozen=True, slots=True)
class TopicEntry:
    """A topic as one broker registers it."""

    queues: int
    perm: int = PERM_READ_WRITE


@dataclass(frozen=True, slots=True)
class BrokerRoute:
    """One broker group's part of a topic's route: where it is and which queue ids (0..queues-1)
    it has. `address` is the group's master (sends and pulls); while the group has no live master
    it is a replica's, `is_master` is False and `perm` has no write bit. `replicas` are the other
    live members' addresses, where a consumer pulls when the master does not answer."""

    cluster: str
    name: str
    address: str  # "scheme://host:port", the scheme names the transport plugin
    queues: int
    perm: int
    replicas: tuple[str, ...] = ()
    is_master: bool = True

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_wire(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "name": self.name, "address": self.address,
                "queues": self.queues, "perm": self.perm, "replicas": list(self.replicas),
                "master": self.is_master}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> BrokerRoute:
        return cls(str(d["cluster"]), str(d["name"]), str(d["address"]), int(d["queues"]), int(d["perm"]),
                   tuple(str(a) for a in d.get("replicas") or ()), bool(d.get("master", True)))


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Every live broker that has the topic, sorted by (cluster, name)."""

    topic: str
    brokers: list[BrokerRoute] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {"topic": self.topic, "brokers": [b.to_wire() for b in self.brokers]}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TopicRoute:
        return cls(str(d["topic"]), [BrokerRoute.from_wire(b) for b in d["brokers"]])


@dataclass(frozen=True, slots=True)
class BrokerSummary:
    """One registered broker as GET_CLUSTER_INFO lists it."""

    cluster: str
    name: str
    address: str
    topics: int  # how many topics it registered
    data_version: int
    heartbeat_age_s: float  # seconds since its last registration reached this name server
    registered_age_s: float  # seconds since it (last) joined this name server
    broker_id: int = 0
    role: str = "master"  # as it registered (its replication role; "master" without replication)
    epoch: int = 0
    log_end: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "name": self.name, "address": self.address, "topics": self.topics,
                "data_version": self.data_version, "heartbeat_age_s": self.heartbeat_age_s,
                "registered_age_s": self.registered_age_s, "broker_id": self.broker_id, "role": self.role,
                "epoch": self.epoch, "log_end": self.log_end}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> BrokerSummary:
        return cls(str(d["cluster"]), str(d["name"]), str(d["address"]), int(d["topics"]),
                   int(d["data_version"]), float(d["heartbeat_age_s"]), float(d["registered_age_s"]),
                   int(d.get("broker_id", 0)), str(d.get("role", "master")), int(d.get("epoch", 0)),
                   int(d.get("log_end", 0)))


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """Every live broker a name server knows, sorted by (cluster, name)."""

    brokers: list[BrokerSummary] = field(default_factory=list)

    @property
    def clusters(self) -> dict[str, list[str]]:
        """cluster -> broker (group) names, sorted, each once."""
        out: dict[str, list[str]] = {}
        for b in self.brokers:
            names = out.setdefault(b.cluster, [])
            if b.name not in names:
                names.append(b.name)
        return out

    def fronts(self) -> list[BrokerSummary]:
        """One member per broker group, the one an admin call goes to: the member registered as
        master (the highest epoch if several say so), else the lowest broker id."""
        best: dict[tuple[str, str], BrokerSummary] = {}
        for b in self.brokers:
            cur = best.get((b.cluster, b.name))
            if cur is None or (b.role == "master", b.epoch, -b.broker_id) > (cur.role == "master", cur.epoch,
                                                                            -cur.broker_id):
                best[(b.cluster, b.name)] = b
        return sorted(best.values(), key=lambda b: (b.cluster, b.name))

    def to_wire(self) -> dict[str, Any]:
        return {"clusters": self.clusters, "brokers": [b.to_wire() for b in self.brokers]}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ClusterInfo:
        return cls([BrokerSummary.from_wire(b) for b in d["brokers"]])


def topics_from_wire(raw: object) -> dict[str, TopicEntry]:
    """The `topics` field of REGISTER_BROKER: {name: {queues: int >= 1, perm: int}} (ProtocolError otherwise)."""
    if not isinstance(raw, dict):
        raise ProtocolError("header field 'topics' must be a map of topic -> {queues, perm}")
    out: dict[str, TopicEntry] = {}
    for name, entry in raw.items():
        queues = entry.get("queues") if isinstance(entry, dict) else None
        perm = entry.get("perm", PERM_READ_WRITE) if isinstance(entry, dict) else None
        if (not isinstance(name, str) or not isinstance(queues, int) or isinstance(queues, bool)
                or queues < 1 or not isinstance(perm, int) or isinstance(perm, bool)):
            raise ProtocolError(f"topic {name!r} in 'topics' must be {{queues: int >= 1, perm: int}}")
        out[name] = TopicEntry(queues, perm)
    return out


def topics_to_wire(topics: dict[str, TopicEntry]) -> dict[str, dict[str, int]]:
    return {name: {"queues": t.queues, "perm": t.perm} for name, t in topics.items()}
