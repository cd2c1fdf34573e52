"""Controller: the name server's request handlers for codes 60-62 and the leader's decision loop.

Every name server with a controller records broker heartbeats (CONTROLLER_HEARTBEAT) and answers
each with the group's committed state: who is master at which epoch. Only the Raft leader decides
(`decide_once`, every DECIDE_INTERVAL_S and at once when a broker's connection closes): it commits
new members, elects a master for a new group or in place of a lost one, and records the master's
in-sync set. A follower answers ELECT_MASTER with `not_leader` naming the leader; a leader
without a majority cannot commit and answers `no_quorum`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from equeue_core.codes import Code
from equeue_core.config import Config
from equeue_core.contracts import ServerConnection
from equeue_core.controller.election import choose_master, next_epoch
from equeue_core.controller.liveness import Heartbeat, Liveness
from equeue_core.controller.peers import controller_peers
from equeue_core.controller.raft import RaftState, propose
from equeue_core.controller.state import ControllerState, GroupState
from equeue_core.dispatch import Handler, header_int, header_str
from equeue_core.errors import EQueueError, FailoverRefusedError, NotLeaderError, ProtocolError
from equeue_core.frame import Frame

log = logging.getLogger("equeue.controller")

DECIDE_INTERVAL_S = 0.25
FRESH_MARGIN_S = 0.3  # a candidate's report counts as final when it arrived this long after the loss
FRESH_WAIT_S = 2.5  # at most this long after the loss for those reports (agents send one a second)


def _int_list(v: object, key: str) -> list[int]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ProtocolError(f"header field {key!r} must be a list of broker ids")
    return v


def heartbeat_from_header(h: dict, connection_id: int | None) -> Heartbeat:
    role = h.get("role", "replica")
    if role not in ("master", "replica"):
        raise ProtocolError(f"header field 'role' must be 'master' or 'replica', not {role!r}")
    master = h.get("master_address")
    if master is not None and not isinstance(master, str):
        raise ProtocolError("header field 'master_address' must be a string")
    replicas = h.get("replicas") or {}
    if not isinstance(replicas, dict):
        raise ProtocolError("header field 'replicas' must be a map of broker id -> status")
    address = header_str(h, "address")
    if "://" not in address:
        raise ProtocolError(f"header field 'address' must be scheme://host:port, not {address!r}")
    return Heartbeat(header_str(h, "cluster"), header_str(h, "name"), header_int(h, "broker_id"), address, role,
                     header_int(h, "epoch"), header_int(h, "log_end"), master, _int_list(h.get("in_sync"), "in_sync"),
                     {int(k): v for k, v in replicas.items() if isinstance(v, dict) and str(k).isdigit()},
                     connection_id)


class Controller:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = ControllerState()
        self.liveness = Liveness(config.controller_master_timeout_s)
        self.unclean = config.unclean_election
        self.self_address, partners = controller_peers(config.controller_peers, config.host, config.controller_port)
        self.raft = RaftState(self.self_address, partners, self.state)
        self._leader_since: float | None = None
        self._decide_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._warned: set[tuple[str, str, int]] = set()  # (cluster, name, epoch) with no candidate, logged once
        self.elections = 0  # elections this name server committed as leader (automatic and by hand)
        self._lost_at: dict[tuple[str, str, int], float] = {}  # (cluster, name, epoch) -> when its master was lost
        self.handlers: dict[int, Handler] = {
            Code.CONTROLLER_HEARTBEAT: self.on_heartbeat,
            Code.CONTROLLER_INFO: self.on_info,
            Code.ELECT_MASTER: self.on_elect,
        }

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._decide_forever())
        log.info("controller %s started; peers %s", self.self_address, self.config.controller_peers)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.to_thread(self.raft.destroy)

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the name server's metrics endpoint shows of the controller (docs/operations.md)."""
        return {"leader": self.raft.is_leader(), "elections": self.elections,
                "groups": [{"cluster": g.cluster, "name": g.name, "epoch": g.epoch, "has_master": g.master_id is not None,
                            "in_sync": len(g.in_sync)} for g in self.state.groups()]}

    def master_of(self, cluster: str, name: str) -> int | None:
        return self.state.master_of(cluster, name)

    def connection_lost(self, connection_id: int) -> None:
        if self.liveness.connection_lost(connection_id):
            self._wake.set()

    # ------------------------------------------------------------ requests

    async def on_heartbeat(self, conn: ServerConnection, frame: Frame) -> Frame:
        beat = heartbeat_from_header(frame.header, conn.id)
        self.liveness.record(beat)
        g = self.state.group(beat.cluster, beat.name)
        if g is not None and g.master_id == beat.broker_id and beat.role == "master" \
                and set(beat.in_sync) != g.in_sync and self.raft.is_leader():
            self._wake.set()  # the master's in-sync set changed: record it now
        return frame.response(self._decision(beat.cluster, beat.name, beat.broker_id, g))

    def _decision(self, cluster: str, name: str, broker_id: int, g: GroupState | None) -> dict[str, Any]:
        master_id = None if g is None else g.master_id
        role = "none" if master_id is None else ("master" if master_id == broker_id else "replica")
        return {"cluster": cluster, "name": name, "epoch": 0 if g is None else g.epoch, "master_id": master_id,
                "master_address": None if g is None else g.master_address, "role": role,
                "leader": self.raft.is_leader(), "controller_leader": self.raft.leader_address()}

    async def on_info(self, conn: ServerConnection, frame: Frame) -> Frame:
        groups = []
        for g in self.state.groups():
            d = g.to_wire()
            master_beat = self.liveness.beats.get((g.cluster, g.name, g.master_id)) if g.master_id is not None else None
            d["alive"] = [i for i in sorted(g.members) if self.liveness.alive(g.cluster, g.name, i)]
            d["heartbeat_age_s"] = {str(i): self.liveness.age(g.cluster, g.name, i) for i in sorted(g.members)}
            d["log_end"] = {str(b.broker_id): b.log_end for b in self.liveness.members(g.cluster, g.name)}
            d["lag_bytes"] = {str(i): r.get("lag_bytes") for i, r in (master_beat.replicas.items() if master_beat else ())
                              if isinstance(r.get("lag_bytes"), int)}
            groups.append(d)
        return frame.response({**self.raft.status(), "master_timeout_s": self.liveness.timeout_s,
                               "unclean_election": self.unclean, "groups": groups})

    async def on_elect(self, conn: ServerConnection, frame: Frame) -> Frame:
        """Move mastership by hand: to `broker_id` (a live member of the in-sync set), or without it
        to the best in-sync member other than the current master."""
        h = frame.header
        cluster, name = header_str(h, "cluster"), header_str(h, "name")
        target = h.get("broker_id")
        if target is not None and (not isinstance(target, int) or isinstance(target, bool)):
            raise ProtocolError("header field 'broker_id' must be an integer")
        async with self._decide_lock:
            if not self.raft.is_leader():
                leader = self.raft.leader_address()
                raise NotLeaderError(f"this controller is not the Raft leader; ask {leader or 'another name server'}",
                                     leader=leader)
            g = self.state.group(cluster, name)
            if g is None or not g.members:
                raise FailoverRefusedError(f"no broker group {name!r} in cluster {cluster!r} is known to the controller",
                                           cluster=cluster, name=name)
            alive = self._alive_fn(cluster, name)
            beats = self.liveness.members(cluster, name)
            if target is None:
                target = choose_master(g, beats, alive, exclude=g.master_id)
                if target is None:
                    raise FailoverRefusedError(f"group {name!r} has no live in-sync replica to move mastership to "
                                               f"(in-sync: {sorted(g.in_sync) or 'none'})", cluster=cluster, name=name)
            elif target == g.master_id:
                return frame.response({**g.to_wire(), "changed": False})
            else:
                if target not in g.members:
                    raise FailoverRefusedError(f"broker id {target} is not a member of group {name!r} "
                                               f"(members: {sorted(g.members)})", cluster=cluster, name=name)
                if target not in g.in_sync:
                    raise FailoverRefusedError(
                        f"broker id {target} is not in the in-sync set of group {name!r} "
                        f"(in-sync: {sorted(g.in_sync) or 'none'}): electing it could lose acknowledged messages",
                        cluster=cluster, name=name)
                if not alive(target):
                    raise FailoverRefusedError(f"broker id {target} of group {name!r} is not alive",
                                               cluster=cluster, name=name)
            result = await self._elect(g, target, beats, "by hand")
            if not result["applied"]:
                raise FailoverRefusedError(f"group {name!r} changed while electing (now epoch {result['epoch']}); "
                                           "try again", cluster=cluster, name=name)
            return frame.response({**{k: v for k, v in result.items() if k != "applied"}, "changed": True})

    # ------------------------------------------------------------ the leader's decisions

    def _alive_fn(self, cluster: str, name: str) -> Callable[[int], bool]:
        since = self._leader_since or 0.0
        return lambda i: self.liveness.alive(cluster, name, i, since)

    async def _elect(self, g: GroupState, target: int, beats: list[Heartbeat], why: str) -> dict:
        epoch = next_epoch(g, beats)
        result = await propose(self.raft, "elect", g.cluster, g.name, g.epoch, target, epoch)
        if result["applied"]:
            self.elections += 1
            log.warning("group %s/%s: broker %d elected master at epoch %d (%s; was %s at epoch %d)",
                        g.cluster, g.name, target, epoch, why, g.master_id, g.epoch)
        return result

    async def _decide_forever(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), DECIDE_INTERVAL_S)
            except TimeoutError:
                pass
            self._wake.clear()
            if not self.raft.is_leader():
                self._leader_since = None
                continue
            if self._leader_since is None:
                self._leader_since = time.monotonic()
                log.info("controller %s is the Raft leader", self.self_address)
            try:
                async with self._decide_lock:
                    await self.decide_once()
            except EQueueError as e:
                log.warning("controller decision not committed: %s", e)
            except Exception:
                log.exception("controller decision failed")

    async def decide_once(self) -> None:
        now = time.monotonic()
        since = self._leader_since or now
        groups = set(self.liveness.groups()) | {(g.cluster, g.name) for g in self.state.groups()}
        for cluster, name in sorted(groups):
            beats = self.liveness.members(cluster, name)
            alive = self._alive_fn(cluster, name)
            g = self.state.group(cluster, name)
            for b in beats:
                if not b.closed and alive(b.broker_id) and (g is None or g.members.get(b.broker_id) != b.address):
                    await propose(self.raft, "member", cluster, name, b.broker_id, b.address)
            g = self.state.group(cluster, name)
            if g is None or not g.members:
                continue
            master = self.liveness.beats.get((cluster, name, g.master_id)) if g.master_id is not None else None
            if g.master_id is None:
                first = self.liveness.first_seen.get((cluster, name), now)
                if now - max(first, since) < self.liveness.timeout_s:
                    continue  # a new group: give every member a timeout to report before the first election
                why = "first master"
            elif not alive(g.master_id):
                why = f"master {g.master_id} lost"
            elif master is not None and master.role != "master" and master.epoch >= g.epoch and g.epoch > 0:
                why = f"master {g.master_id} restarted"
            else:
                if master is not None and master.role == "master" and master.epoch == g.epoch \
                        and set(master.in_sync) & set(g.members) != g.in_sync:
                    await propose(self.raft, "in_sync", cluster, name, g.epoch, g.master_id,
                                  sorted(set(master.in_sync) & set(g.members)))
                continue
            lost_at = self._lost_at.setdefault((cluster, name, g.epoch), now)
            if g.master_id is not None and now - lost_at < FRESH_WAIT_S:
                stale = [b for b in beats if b.broker_id != g.master_id and alive(b.broker_id)
                         and b.last_seen < lost_at + FRESH_MARGIN_S]
                if stale:
                    continue  # wait for the candidates' reports sent after the loss: their final log ends
            target = choose_master(g, beats, alive, self.unclean)
            if target is None:
                if (cluster, name, g.epoch) not in self._warned:
                    self._warned.add((cluster, name, g.epoch))
                    log.error("group %s/%s: %s and no live in-sync member can replace it (in-sync was %s); the group "
                              "stays without a master (unclean_election = false)", cluster, name, why,
                              sorted(g.in_sync) or "empty")
                continue
            await self._elect(g, target, beats, why)
