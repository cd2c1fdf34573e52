"""Consumer groups on the broker: membership by heartbeat, change notices, orderly queue locks, admin.

A member is dropped when its connection closes or it is silent longer than the expiry; the other
members get a GROUP_CHANGED push so they rebalance now rather than at their next timer. Offsets
belong to (group, topic, queue), never to a member, so membership changes never move them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from equeue_core.broker.topics import DLQ_PREFIX, RETRY_PREFIX
from equeue_core.codes import Code
from equeue_core.contracts import ServerConnection
from equeue_core.errors import ProtocolError
from equeue_core.frame import FLAG_PUSH, Frame

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

log = logging.getLogger("equeue.groups")


@dataclass
class Member:
    client_id: str
    group: str
    conn: ServerConnection
    mode: str = "clustering"
    subscriptions: dict[str, str] = field(default_factory=dict)
    queues: list[list[Any]] = field(default_factory=list)
    last_seen: float = 0.0


def _str(h: dict, key: str) -> str:
    v = h.get(key)
    if not isinstance(v, str) or not v:
        raise ProtocolError(f"header field {key!r} must be a non-empty string")
    return v


class GroupRegistry:
    def __init__(self, broker: Broker, expiry_s: float, lock_expiry_s: float) -> None:
        self.broker = broker
        self.expiry_s = expiry_s
        self.lock_expiry_s = lock_expiry_s
        self.groups: dict[str, dict[str, Member]] = {}
        self.locks: dict[tuple[str, str, int], tuple[str, float]] = {}

    def handlers(self) -> dict:
        return {
            Code.HEARTBEAT: self.on_heartbeat,
            Code.UNREGISTER: self.on_unregister,
            Code.GROUP_MEMBERS: self.on_group_members,
            Code.LOCK_QUEUES: self.on_lock,
            Code.UNLOCK_QUEUES: self.on_unlock,
            Code.GROUP_INFO: self.on_group_info,
            Code.RESET_OFFSETS: self.on_reset_offsets,
        }

    # ---------------------------------------------------------------- membership

    def members(self, group: str) -> list[str]:
        return sorted(self.groups.get(group, {}))

    def _notify(self, group: str, skip: str | None = None) -> None:
        for m in list(self.groups.get(group, {}).values()):
            if m.client_id != skip and not m.conn.closed:
                try:
                    m.conn.push(Frame(Code.GROUP_CHANGED, 0, FLAG_PUSH, {"group": group}))
                except Exception:  # a dead connection is cleaned up by connection_lost
                    log.debug("push to %s failed", m.client_id)

    def _remove(self, group: str, client_id: str) -> None:
        members = self.groups.get(group)
        if members and members.pop(client_id, None) is not None:
            for key, (holder, _) in list(self.locks.items()):
                if key[0] == group and holder == client_id:
                    del self.locks[key]
            if not members:
                del self.groups[group]
            log.info("consumer %s left group %s", client_id, group)
            self._notify(group)

    async def on_heartbeat(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        group, client_id = _str(h, "group"), _str(h, "client_id")
        subs = h.get("subscriptions") or {}
        if not isinstance(subs, dict):
            raise ProtocolError("subscriptions must be a map of topic -> expression")
        members = self.groups.setdefault(group, {})
        m = members.get(client_id)
        changed = m is None or m.subscriptions != subs or m.conn is not conn
        if m is None:
            m = members[client_id] = Member(client_id, group, conn)
            log.info("consumer %s joined group %s", client_id, group)
        m.conn = conn
        m.mode = str(h.get("mode", "clustering"))
        m.subscriptions = subs
        queues = h.get("queues")
        if isinstance(queues, list):
            m.queues = queues
        m.last_seen = time.monotonic()
        if changed:
            self._notify(group, skip=client_id)
        return frame.response({"members": self.members(group)})

    async def on_unregister(self, conn: ServerConnection, frame: Frame) -> Frame:
        self._remove(_str(frame.header, "group"), _str(frame.header, "client_id"))
        return frame.response({})

    async def on_group_members(self, conn: ServerConnection, frame: Frame) -> Frame:
        return frame.response({"members": self.members(_str(frame.header, "group"))})

    def connection_lost(self, conn: ServerConnection) -> None:
        for group, members in list(self.groups.items()):
            for client_id, m in list(members.items()):
                if m.conn is conn:
                    self._remove(group, client_id)

    async def expire_forever(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, max(0.2, self.expiry_s / 4)))
            now = time.monotonic()
            for group, members in list(self.groups.items()):
                for client_id, m in list(members.items()):
                    if now - m.last_seen > self.expiry_s:
                        log.warning("consumer %s of group %s silent for %.0fs: dropped",
                                    client_id, group, now - m.last_seen)
                        self._remove(group, client_id)
            for key, (_, until) in list(self.locks.items()):
                if until < now:
                    del self.locks[key]

    # ---------------------------------------------------------------- orderly locks

    def _queues_arg(self, h: dict) -> list[tuple[str, int]]:
        qs = h.get("queues")
        if not isinstance(qs, list):
            raise ProtocolError("queues must be a list of [topic, queue_id]")
        out = []
        for q in qs:
            if not (isinstance(q, list) and len(q) == 2 and isinstance(q[0], str) and isinstance(q[1], int)):
                raise ProtocolError("queues must be a list of [topic, queue_id]")
            out.append((q[0], q[1]))
        return out

    async def on_lock(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        group, client_id = _str(h, "group"), _str(h, "client_id")
        now = time.monotonic()
        locked = []
        for topic, q in self._queues_arg(h):
            key = (group, topic, q)
            holder = self.locks.get(key)
            if holder is None or holder[0] == client_id or holder[1] < now:
                self.locks[key] = (client_id, now + self.lock_expiry_s)
                locked.append([topic, q])
        return frame.response({"locked": locked})

    async def on_unlock(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        group, client_id = _str(h, "group"), _str(h, "client_id")
        for topic, q in self._queues_arg(h):
            key = (group, topic, q)
            if self.locks.get(key, ("",))[0] == client_id:
                del self.locks[key]
        return frame.response({})

    # ---------------------------------------------------------------- admin

    def group_names(self) -> list[str]:
        names = set(self.groups)
        names.update(g for g, _, _ in self.broker.offsets.all())
        return sorted(names)

    def progress(self, group: str) -> list[dict[str, Any]]:
        """Per queue of every topic the group has offsets for or subscribes to: committed, max, lag."""
        broker = self.broker
        topics = {t for g, t, _ in broker.offsets.all() if g == group}
        for m in self.groups.get(group, {}).values():
            topics.update(m.subscriptions)
        rows = []
        for topic in sorted(topics):
            if topic not in broker.topics.topics:
                continue
            for q in range(broker.topics.topics[topic]):
                lo, hi = broker.store.queue_range(topic, q)
                committed = broker.offsets.get(group, topic, q)
                owner = next((m.client_id for m in self.groups.get(group, {}).values()
                              if [topic, q] in m.queues), None)
                rows.append({"topic": topic, "queue_id": q, "committed": committed,
                             "min_offset": lo, "max_offset": hi,
                             "lag": hi - (committed if committed is not None else lo),
                             "owner": owner})
        return rows

    async def on_group_info(self, conn: ServerConnection, frame: Frame) -> Frame:
        wanted = frame.header.get("group")
        names = [wanted] if isinstance(wanted, str) else self.group_names()
        out = {}
        for g in names:
            out[g] = {
                "members": [{"client_id": m.client_id, "mode": m.mode, "subscriptions": m.subscriptions,
                             "queues": m.queues} for m in self.groups.get(g, {}).values()],
                "queues": self.progress(g),
                "retry_topic": RETRY_PREFIX + g, "dlq_topic": DLQ_PREFIX + g,
            }
        return frame.response({"groups": out})

    async def on_reset_offsets(self, conn: ServerConnection, frame: Frame) -> Frame:
        h = frame.header
        group, topic = _str(h, "group"), _str(h, "topic")
        to = h.get("to")
        broker = self.broker
        n = broker.topics.queues(topic)
        result = []
        for q in range(n):
            lo, hi = broker.store.queue_range(topic, q)
            if to == "earliest":
                off = lo
            elif to == "latest":
                off = hi
            elif isinstance(to, int) and not isinstance(to, bool):
                off = broker.store.offset_for_timestamp(topic, q, to)
            else:
                raise ProtocolError("reset 'to' must be 'earliest', 'latest' or a timestamp in ms")
            broker.offsets.commit(group, topic, q, off)
            result.append([topic, q, off])
        broker.offsets.persist()
        self._notify(group)
        return frame.response({"offsets": result})
