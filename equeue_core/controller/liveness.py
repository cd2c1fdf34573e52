"""Broker heartbeats as this name server saw them (memory only, never replicated).

Brokers heartbeat every name server (controller_agent.py), so whichever becomes Raft leader
already knows who is alive. A broker is alive while its last heartbeat is younger than the master
timeout and the connection it came over is open (a closed connection is how a `kill -9` shows up
at once, RocketMQ's onBrokerChannelClose). A leader that has not been leader for a full timeout
counts every member as seen at the moment it took over, so a fresh leader never deposes a master
it simply has not heard from yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Heartbeat:
    cluster: str
    name: str
    broker_id: int
    address: str
    role: str  # what the broker says it is now
    epoch: int
    log_end: int
    master_address: str | None = None
    in_sync: list[int] = field(default_factory=list)  # master only
    replicas: dict[int, dict[str, Any]] = field(default_factory=dict)  # master only: per replica lag_bytes etc.
    connection_id: int | None = None
    last_seen: float = 0.0  # monotonic
    closed: bool = False  # the connection it came over closed since


class Liveness:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.beats: dict[tuple[str, str, int], Heartbeat] = {}
        self.first_seen: dict[tuple[str, str], float] = {}  # group -> when this name server first heard of it

    def record(self, beat: Heartbeat) -> None:
        beat.last_seen = self.clock()
        self.beats[(beat.cluster, beat.name, beat.broker_id)] = beat
        self.first_seen.setdefault((beat.cluster, beat.name), beat.last_seen)

    def connection_lost(self, connection_id: int) -> list[Heartbeat]:
        gone = [b for b in self.beats.values() if b.connection_id == connection_id and not b.closed]
        for b in gone:
            b.closed = True
        return gone

    def alive(self, cluster: str, name: str, broker_id: int, since: float = 0.0) -> bool:
        """Alive: heard within the timeout over a connection still open. `since` (when this peer
        became leader) stands in for the heartbeat of a member it has not heard from yet."""
        b = self.beats.get((cluster, name, broker_id))
        if b is None:
            return self.clock() - since < self.timeout_s
        return not b.closed and self.clock() - max(b.last_seen, since) < self.timeout_s

    def members(self, cluster: str, name: str) -> list[Heartbeat]:
        return sorted((b for b in self.beats.values() if (b.cluster, b.name) == (cluster, name)),
                      key=lambda b: b.broker_id)

    def groups(self) -> list[tuple[str, str]]:
        return sorted({(b.cluster, b.name) for b in self.beats.values()})

    def age(self, cluster: str, name: str, broker_id: int) -> float | None:
        b = self.beats.get((cluster, name, broker_id))
        return None if b is None else round(self.clock() - b.last_seen, 3)
