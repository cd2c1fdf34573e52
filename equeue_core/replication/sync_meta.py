"""Consumer offsets and topic definitions between a master and its replicas.

Every second a replica sends REPL_SYNC_META with all its consumer offsets and gets the master's
topics and offsets back. Both sides keep the higher offset per (group, topic, queue): offsets
committed on a replica while its master was away (consumers fall back to replicas) reach the
master when it is reachable again, and a replica learns what was consumed on the master. The
replica takes the master's topic list as it is (created, resized and deleted topics).

A consequence of "higher wins": moving a group backwards (RESET_OFFSETS to earliest) on the
master can be undone by a replica that still has the higher offset, until it synced once; reset
offsets while the group's consumers are stopped and wait a second before starting them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from equeue_core.codes import Code
from equeue_core.errors import EQueueError, ProtocolError
from equeue_core.frame import Frame

if TYPE_CHECKING:
    from equeue_core.replication.replication import Replication

log = logging.getLogger("equeue.replication")


def _entries(raw: Any) -> list[tuple[str, str, int, int]]:
    if not isinstance(raw, list):
        raise ProtocolError("offsets must be a list of [group, topic, queue_id, offset]")
    out = []
    for e in raw:
        if (not isinstance(e, list) or len(e) != 4 or not isinstance(e[0], str) or not isinstance(e[1], str)
                or not isinstance(e[2], int) or not isinstance(e[3], int)):
            raise ProtocolError("offsets must be a list of [group, topic, queue_id, offset]")
        out.append((e[0], e[1], e[2], e[3]))
    return out


class MetaSync:
    def __init__(self, repl: Replication) -> None:
        self.repl = repl

    def _all_offsets(self) -> list[list]:
        return [[g, t, q, o] for (g, t, q), o in self.repl.broker.offsets.all().items()]

    def merge_offsets(self, entries: list[tuple[str, str, int, int]]) -> int:
        """Commit each offset higher than the one kept here; returns how many moved."""
        offsets = self.repl.broker.offsets
        moved = 0
        for group, topic, qid, off in entries:
            cur = offsets.get(group, topic, qid)
            if cur is None or off > cur:
                try:
                    offsets.commit(group, topic, qid, off)
                    moved += 1
                except EQueueError as e:
                    log.warning("replicated offset %s/%s/%d=%d refused: %s", group, topic, qid, off, e)
        return moved

    async def on_sync_meta(self, conn, frame: Frame) -> Frame:
        """Master: take the replica's offsets (higher wins), answer with topics and offsets."""
        self.merge_offsets(_entries(frame.header.get("offsets", [])))
        return frame.response({"topics": dict(self.repl.broker.topics.topics), "offsets": self._all_offsets()})

    async def sync_with(self, conn) -> None:
        """Replica: one exchange with the master over its replication connection."""
        resp = await conn.request(Code.REPL_SYNC_META, {"broker_id": self.repl.config.broker_id,
                                                        "offsets": self._all_offsets()}, timeout=10)
        self.merge_offsets(_entries(resp.header.get("offsets", [])))
        topics = resp.header.get("topics")
        if not isinstance(topics, dict):
            raise ProtocolError("topics must be a map")
        registry = self.repl.broker.topics
        for name, n in topics.items():
            if isinstance(name, str) and isinstance(n, int) and registry.topics.get(name) != n:
                registry.topics.pop(name, None)  # take the master's count as is, even a smaller one
                registry.create(name, n, system=True)
        for name in [t for t in registry.topics if t not in topics]:
            registry.delete(name)
