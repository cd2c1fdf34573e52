"""The master's side: serve replicas' fetches, track what each has stored, answer sync sends.

A replica fetches from its own log end (RocketMQ HAConnection style): that position is also its
acknowledgement, since it only asks for more after it stored what it had. The master keeps per
replica its acked end and when it was last heard; a replica is *in sync* while it is connected,
was heard within IN_SYNC_SILENCE_S and is at most `replica_max_lag_bytes` behind the log end.

Sync replication (`watch`, then `wait_replicated`): a send is answered once `min_insync` replicas
acked its end position. Before storing, `require_in_sync` (through Replication.sync_write) refuses a send at once when fewer
replicas are in sync (never a silent downgrade); a waiter fails with NotEnoughReplicasError when
the in-sync set drops below `min_insync`, when this broker stops being master (`forget`) or after
ACK_TIMEOUT_S, so a send never hangs and is never answered as replicated by a broker that was
demoted before its replicas had it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from equeue_core.errors import NotEnoughReplicasError, NotMasterError, ProtocolError, ReplicaRefusedError
from equeue_core.frame import Frame
from equeue_core.threads import run_to_end

if TYPE_CHECKING:
    from equeue_core.replication.replication import Replication

log = logging.getLogger("equeue.replication")

IN_SYNC_SILENCE_S = 10.0
ACK_TIMEOUT_S = 5.0
MAX_FETCH_BYTES = 4 * 1024 * 1024
MAX_WAIT_MS = 5000
INLINE_READ_BYTES = 1024 * 1024  # a fetch this close to the log end reads on the event loop


@dataclass
class ReplicaState:
    broker_id: int
    address: str
    conn_id: int
    acked: int = 0
    last_seen: float = 0.0
    connected: bool = True


@dataclass(eq=False)
class _Waiter:
    """A stored write's wait for its replicas' acknowledgements (Master.watch)."""

    end: int
    future: asyncio.Future
    owner: Master


def _retrieve(future: asyncio.Future) -> None:
    """Mark a waiter's outcome as seen: a send whose answer never waited (its connection closed
    first) must not log "Future exception was never retrieved" when its broker is demoted."""
    if not future.cancelled():
        future.exception()


async def wait_replicated(waiter: _Waiter | None) -> None:
    """Until the replicas acked what `waiter` watches (None: they had already); raises
    NotEnoughReplicasError when that cannot happen, or after ACK_TIMEOUT_S."""
    if waiter is None:
        return
    master = waiter.owner
    try:
        await asyncio.wait_for(asyncio.shield(waiter.future), ACK_TIMEOUT_S)
    except TimeoutError:
        raise NotEnoughReplicasError(
            f"stored, but not acknowledged by {master.repl.config.min_insync} replica(s) within "
            f"{ACK_TIMEOUT_S:g} s", in_sync=len(master.in_sync_ids()),
            min_insync=master.repl.config.min_insync) from None
    finally:
        if waiter in master._waiters:
            master._waiters.remove(waiter)


def _int(h: dict, key: str, default: Any = ...) -> int:
    v = h.get(key, default)
    if v is ... or not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"header field {key!r} must be an integer")
    return v


class Master:
    def __init__(self, repl: Replication) -> None:
        self.repl = repl
        self.replicas: dict[int, ReplicaState] = {}
        self._waiters: list[_Waiter] = []
        self._grew = asyncio.Event()
        self._grew_watched = False  # a fetch waits on _grew (else appended() has nothing to wake)

    # ------------------------------------------------------------ the in-sync set
    def in_sync_ids(self) -> list[int]:
        now = time.monotonic()
        end = self.repl.log.end_position()
        lag = self.repl.config.replica_max_lag_bytes
        return sorted(r.broker_id for r in self.replicas.values()
                      if r.connected and now - r.last_seen <= IN_SYNC_SILENCE_S and end - r.acked <= lag)

    def require_in_sync(self) -> None:
        """Before a sync-replicated write: refuse at once if too few replicas are in sync."""
        need = self.repl.config.min_insync
        have = self.in_sync_ids()
        if len(have) < need:
            raise NotEnoughReplicasError(f"{len(have)} in-sync replica(s), sync replication needs {need}",
                                         in_sync=len(have), min_insync=need)

    def watch(self, end: int) -> _Waiter | None:
        """Start waiting for min_insync replicas to ack `end` (None: they already have), for
        `wait_replicated`. The broker calls this in the loop turn that stored the write, so a
        demotion in any later turn (`forget`) fails the wait. The wait used to start when the
        answer's task first ran, a loop turn or more after the store: a send stored as master
        and demoted in between was then answered as replicated though no replica had it, the
        new master never had it, and the old one cut it from its log (docs/replication.md)."""
        if self._acked_by(end) >= self.repl.config.min_insync:
            return None
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        waiter = _Waiter(end, fut, self)
        self._waiters.append(waiter)
        return waiter

    def _acked_by(self, end: int) -> int:
        ids = set(self.in_sync_ids())
        return sum(1 for r in self.replicas.values() if r.broker_id in ids and r.acked >= end)

    def _settle(self) -> None:
        """Answer the waiters the acks now cover; fail them all if the in-sync set is too small."""
        if not self._waiters:
            return
        need = self.repl.config.min_insync
        in_sync = self.in_sync_ids()
        for w in list(self._waiters):
            if w.future.done():
                continue
            if self._acked_by(w.end) >= need:
                w.future.set_result(None)
            elif len(in_sync) < need:
                w.future.set_exception(NotEnoughReplicasError(
                    f"stored, but the in-sync replicas dropped to {len(in_sync)} (need {need})",
                    in_sync=len(in_sync), min_insync=need))

    def appended(self) -> None:
        """The log grew: wake long-polling fetches. Called per stored send: without a fetch
        waiting (no replicas, or none caught up) it only reads a flag."""
        if self._grew_watched:
            self._grew_watched = False
            self._grew.set()
            self._grew = asyncio.Event()

    def connection_lost(self, conn_id: int) -> None:
        for r in self.replicas.values():
            if r.conn_id == conn_id and r.connected:
                r.connected = False
                log.warning("replica %d (%s) disconnected at position %d", r.broker_id, r.address, r.acked)
        self._settle()

    def forget(self) -> None:
        """This broker stops being master: every waiter fails, replicas are forgotten."""
        for w in self._waiters:
            if not w.future.done():
                w.future.set_exception(NotEnoughReplicasError("this broker is no longer the master"))
        self._waiters.clear()
        self.replicas.clear()
        self.appended()

    # ------------------------------------------------------------ requests from replicas
    async def on_hello(self, conn, frame: Frame) -> Frame:
        h = frame.header
        cfg = self.repl.config
        cluster, name = h.get("cluster"), h.get("name")
        broker_id, epoch = _int(h, "broker_id"), _int(h, "epoch")
        address = str(h.get("address", conn.peer))
        if (cluster, name) != (cfg.cluster, cfg.broker_name):
            log.error("refused replica %s (broker id %d): it belongs to group %s/%s, this master to %s/%s",
                      address, broker_id, cluster, name, cfg.cluster, cfg.broker_name)
            raise ReplicaRefusedError(f"this master is {cfg.cluster}/{cfg.broker_name}, "
                                      f"not {cluster}/{name}")
        if broker_id == cfg.broker_id:
            raise ReplicaRefusedError(f"broker id {broker_id} is this master's own id")
        if epoch > self.repl.epoch:
            log.error("refused replica %s (broker id %d): its epoch %d is ahead of this master's %d",
                      address, broker_id, epoch, self.repl.epoch)
            raise ReplicaRefusedError(f"replica epoch {epoch} is ahead of this master's epoch {self.repl.epoch}")
        old = self.replicas.get(broker_id)
        self.replicas[broker_id] = ReplicaState(broker_id, address, conn.id,
                                                acked=old.acked if old else 0, last_seen=time.monotonic())
        log.info("replica %d (%s) connected", broker_id, address)
        return frame.response({"cluster": cfg.cluster, "name": cfg.broker_name, "broker_id": cfg.broker_id,
                               "epoch": self.repl.epoch, "log_end": self.repl.log.end_position(),
                               "epochs": [list(e) for e in self.repl.epochs.entries]})

    async def on_fetch(self, conn, frame: Frame) -> Frame:
        h = frame.header
        broker_id, position = _int(h, "broker_id"), _int(h, "position")
        # the answer must fit a frame: half the frame limit leaves room for the header (a single
        # record is at most max_body_size, below the limit, and read_log always gives the first)
        cap = min(MAX_FETCH_BYTES, self.repl.config.max_frame_size // 2)
        max_bytes = max(1, min(_int(h, "max_bytes", cap), cap))
        wait_ms = max(0, min(_int(h, "wait_ms", 0), MAX_WAIT_MS))
        r = self.replicas.get(broker_id)
        if r is None or r.conn_id != conn.id:
            raise ReplicaRefusedError(f"broker id {broker_id} did not say hello on this connection")
        end = self.repl.log.end_position()
        if position > end:
            log.error("replica %d (%s) reports position %d past this master's end %d: its log diverged",
                      broker_id, r.address, position, end)
            raise ReplicaRefusedError(f"position {position} is past this master's log end {end}")
        start = self.repl.log.start_position()
        if position < start:
            # the records the replica needs next are gone; starting it at `start` would leave its
            # queues without the offsets below (they would be handed out again after a promotion)
            log.error("replica %d (%s) needs position %d, below this master's log start %d (deleted by "
                      "retention)", broker_id, r.address, position, start)
            raise ReplicaRefusedError(f"position {position} is below this master's log start {start} (deleted "
                                      "by retention): seed this replica from a copy of the master's data "
                                      "directory")
        r.acked, r.last_seen, r.connected = position, time.monotonic(), True
        self._settle()
        if end - position > INLINE_READ_BYTES:
            # a replica catching up reads old chunks, maybe from disk: off the event loop
            data = await run_to_end(self.repl.log.read_log, position, max_bytes)
            self._check_still_master()
        else:  # the newest bytes (the file store's ring): cheaper than a thread hop
            data = self.repl.log.read_log(position, max_bytes)
        if not data and wait_ms:
            grew = self._grew
            self._grew_watched = True
            try:
                await asyncio.wait_for(grew.wait(), wait_ms / 1000)
            except TimeoutError:
                pass
            self._check_still_master()
            data = self.repl.log.read_log(position, max_bytes)
        return frame.response({"end": self.repl.log.end_position(), "epoch": self.repl.epoch,
                               "epochs": [list(e) for e in self.repl.epochs.entries]}, data)

    def _check_still_master(self) -> None:
        """A fetch that waited (a held fetch, a read off the loop) answers only while this Master
        is still the broker's (a new epoch while it stays master keeps it, and keeps its replicas
        copying): otherwise NotMasterError, and the replica asks for the group's master again.
        Answered after a demotion, the fetch carried the new epoch to a replica that was still
        copying from here; its next heartbeat then said "replica in the new epoch", which the
        controller reads as its newly elected master having restarted, and it elected again
        (tests/controller/test_group_routes.py saw the flap). After a demotion and a promotion the
        data would also come from a log that may have been cut in between."""
        repl = self.repl
        if repl.master is not self or not repl.is_master:
            raise NotMasterError("this broker stopped being master while the fetch waited",
                                 master=repl.master_address or "")

    def status(self) -> dict[int, dict]:
        now = time.monotonic()
        end = self.repl.log.end_position()
        ids = set(self.in_sync_ids())
        return {r.broker_id: {"address": r.address, "log_end": r.acked, "lag_bytes": max(0, end - r.acked),
                              "last_seen_ms": int((now - r.last_seen) * 1000), "in_sync": r.broker_id in ids,
                              "connected": r.connected}
                for r in self.replicas.values()}
