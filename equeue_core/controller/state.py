"""What the controller remembers: per broker group its members, master, epoch and in-sync set.

This is the replicated state: it changes only through `apply_*`, which the Raft layer
(controller/raft.py) calls on every name server in the same order once an entry is committed.
Each `apply_*` is deterministic and checks its own precondition against the state (an election
names the epoch it expects to replace), so an entry proposed from a view that turned stale is a
no-op instead of a second master. The Raft thread applies, the name server's event loop reads:
one lock guards both, and readers get copies.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


def group_key(cluster: str, name: str) -> str:
    return f"{cluster}/{name}"


@dataclass
class GroupState:
    cluster: str
    name: str
    members: dict[int, str] = field(default_factory=dict)  # broker id -> address
    master_id: int | None = None
    epoch: int = 0  # bumped by every election; a broker ignores decisions of an older epoch
    in_sync: set[int] = field(default_factory=set)  # the master's last reported in-sync replicas (not itself)

    @property
    def master_address(self) -> str | None:
        return None if self.master_id is None else self.members.get(self.master_id)

    def copy(self) -> GroupState:
        return GroupState(self.cluster, self.name, dict(self.members), self.master_id, self.epoch, set(self.in_sync))

    def to_wire(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "name": self.name, "epoch": self.epoch, "master_id": self.master_id,
                "master_address": self.master_address,
                "members": {str(i): a for i, a in sorted(self.members.items())},
                "in_sync": sorted(self.in_sync)}


class ControllerState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, GroupState] = {}

    # ------------------------------------------------------------ reads (any thread)

    def group(self, cluster: str, name: str) -> GroupState | None:
        with self._lock:
            g = self._groups.get(group_key(cluster, name))
            return None if g is None else g.copy()

    def groups(self) -> list[GroupState]:
        with self._lock:
            return [g.copy() for _, g in sorted(self._groups.items())]

    def master_of(self, cluster: str, name: str) -> int | None:
        with self._lock:
            g = self._groups.get(group_key(cluster, name))
            return None if g is None else g.master_id

    # ------------------------------------------------------------ committed entries (the Raft thread)

    def _get(self, cluster: str, name: str) -> GroupState:
        key = group_key(cluster, name)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = GroupState(cluster, name)
        return g

    def apply_member(self, cluster: str, name: str, broker_id: int, address: str) -> bool:
        """A broker joined its group, or is back at another address."""
        with self._lock:
            g = self._get(cluster, name)
            changed = g.members.get(broker_id) != address
            g.members[broker_id] = address
            return changed

    def apply_elect(self, cluster: str, name: str, expected_epoch: int, master_id: int, new_epoch: int) -> dict:
        """`master_id` becomes master at `new_epoch`, if the group is still at `expected_epoch` (else
        another election won first: nothing changes). The in-sync set starts empty, as in RocketMQ's
        controller: only the new master's own report puts replicas back in it."""
        with self._lock:
            g = self._get(cluster, name)
            if g.epoch != expected_epoch or new_epoch <= g.epoch or master_id not in g.members:
                return {"applied": False, **g.to_wire()}
            g.master_id, g.epoch, g.in_sync = master_id, new_epoch, set()
            return {"applied": True, **g.to_wire()}

    def apply_in_sync(self, cluster: str, name: str, epoch: int, master_id: int, in_sync: list[int]) -> bool:
        """The master of `epoch` reported its in-sync replicas (ignored from anyone else)."""
        with self._lock:
            g = self._groups.get(group_key(cluster, name))
            if g is None or g.epoch != epoch or g.master_id != master_id:
                return False
            g.in_sync = {i for i in in_sync if i != master_id and i in g.members}
            return True
