"""Replication: this broker's role in its group (master or replica), as the broker and the
controller's agent drive it (REPLICATION_CONTRACT.md, docs/replication.md).

Static mode starts it from config (`role`, `master_address`); the controller's agent calls
become_master / become_replica. Guarantees:
- a replica refuses every write (NotMasterError naming the master), and serves pulls;
- become_master(epoch) records (epoch, log end) in the epoch file before the first write of the
  new epoch, so any other member can later find where its own log leaves this one;
- become_replica truncates this log to where it agrees with the master's (replica.py) before it
  copies anything, so a record is never served with a position or offset the master gave to
  another record once copying has started.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from equeue_core.codes import Code
from equeue_core.errors import NotMasterError, ProtocolError, ReplicaRefusedError
from equeue_core.frame import Frame
from equeue_core.replication.epochs import EpochFile
from equeue_core.replication.master import Master, wait_replicated
from equeue_core.replication.replica import ReplicaCopier
from equeue_core.replication.sync_meta import MetaSync

if TYPE_CHECKING:
    from equeue_core.broker.broker import Broker

log = logging.getLogger("equeue.replication")


@dataclass
class ReplicationStatus:
    role: str                   # "master" | "replica"
    broker_id: int
    epoch: int                  # current epoch known to this broker (0 before any election)
    log_end: int                # end position of this broker's commit log (bytes)
    master_address: str | None  # for a replica: whom it copies from
    in_sync: list[int] = field(default_factory=list)  # master only: in-sync replica ids
    replicas: dict[int, dict] = field(default_factory=dict)  # master only, see Master.status

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["replicas"] = {str(k): v for k, v in self.replicas.items()}  # msgpack/JSON keys as strings
        return d


class Replication:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.log = broker.engine.replica_log
        self.epochs = EpochFile(self.config.data_dir)
        self.epoch = self.epochs.last_epoch
        self.role = "master"
        self.master_address: str | None = None
        self.master = Master(self)
        self.meta = MetaSync(self)
        self.copier: ReplicaCopier | None = None
        self._change = asyncio.Lock()
        self._held_ends: dict[tuple[str, int], int] = {}  # queue ends at the last copy (copied())

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """The role the config asks for (the controller agent may change it right after)."""
        cfg = self.config
        if getattr(cfg, "controller", False):
            await self.become_replica("", self.epoch)  # no master until the controller names one
        elif cfg.role == "replica":
            await self.become_replica(cfg.master_address, self.epoch)
        else:
            self.role = "master"
            self.broker.role_changed(True)

    async def stop(self) -> None:
        if self.copier is not None:
            await self.copier.stop()
            self.copier = None
        self.master.forget()

    def own_address(self) -> str:
        host, port = self.broker.address
        return f"{self.config.transport}://{host}:{port}"

    # ------------------------------------------------------------ the contract
    @property
    def is_master(self) -> bool:
        return self.role == "master"

    def status(self) -> ReplicationStatus:
        master = self.is_master
        return ReplicationStatus(
            role=self.role, broker_id=self.config.broker_id, epoch=self.epoch,
            log_end=self.log.end_position(), master_address=None if master else (self.master_address or None),
            in_sync=self.master.in_sync_ids() if master else [],
            replicas=self.master.status() if master else {})

    async def become_master(self, epoch: int) -> None:
        """Stop copying; append (epoch, log end) to the epoch file; accept writes from now on."""
        async with self._change:
            if epoch < self.epochs.last_epoch:
                raise ReplicaRefusedError(f"epoch {epoch} is older than this broker's epoch {self.epochs.last_epoch}")
            if self.is_master and epoch == self.epoch and (epoch == 0 or epoch == self.epochs.last_epoch):
                return  # already master in this epoch (an agent may repeat its decision): keep the in-sync set
            if self.copier is not None:
                await self.copier.stop()
                self.copier = None
            end = self.log.end_position()
            if epoch > self.epochs.last_epoch:
                self.epochs.begin(epoch, end)
            self.epoch = max(self.epoch, epoch)
            if not self.is_master:
                self.master = Master(self)  # a master keeps its replicas' state across a new epoch
            self.role, self.master_address = "master", None
            log.warning("now MASTER of %s/%s in epoch %d from position %d", self.config.cluster,
                        self.config.broker_name, self.epoch, end)
            self.broker.role_changed(True)

    async def become_replica(self, master_address: str, epoch: int) -> None:
        """Refuse writes from now on; copy from master_address (none yet if empty) after cutting
        this log back to where it agrees with the master's."""
        async with self._change:
            if (not self.is_master and self.copier is not None and master_address
                    and master_address == self.master_address):
                self.epoch = max(self.epoch, epoch)
                return  # already copying from that master (an agent may repeat its decision)
            was_master = self.is_master
            self.role = "replica"
            self.master.forget()
            self.epoch = max(self.epoch, epoch)
            if self.copier is not None:
                await self.copier.stop()
                self.copier = None
            self.master_address = master_address or None
            if was_master:
                self.broker.role_changed(False)
            if master_address:
                self.copier = ReplicaCopier(self, master_address)
                self.copier.start()
            log.warning("now REPLICA of %s in epoch %d at position %d", master_address or "(no master yet)",
                        self.epoch, self.log.end_position())

    # ------------------------------------------------------------ the broker's hooks
    def check_writable(self) -> None:
        if not self.is_master:
            where = self.master_address or ""
            raise NotMasterError(f"this broker is a replica; send to its master {where or '(unknown)'}",
                                 master=where)

    def check_epoch(self, header: dict) -> None:
        """A write may carry the epoch its sender believes current (`epoch` header, set by
        clients that learn it from the name servers): a different epoch means one of the two is
        out of date (a fenced old master, or a client with a stale route), and the write is
        refused with not_master rather than stored on a broker the group has moved past."""
        epoch = header.get("epoch")
        if epoch is None:
            return
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ProtocolError("header field 'epoch' must be an integer")
        if epoch != self.epoch:
            raise NotMasterError(f"write stamped with epoch {epoch}, this broker is in epoch {self.epoch}",
                                 master=self.master_address or "", epoch=self.epoch)

    def sync_required(self) -> bool:
        return self.is_master and self.config.replication == "sync"

    def sync_write(self) -> bool:
        """Before storing a write: True when its answer must wait for the replicas (this broker
        is master under sync replication), and then NotEnoughReplicasError at once if too few are
        in sync (never a silent downgrade to async)."""
        if not self.sync_required():
            return False
        self.master.require_in_sync()
        return True

    def watch_replicated(self, end: int) -> Any:
        """A write stored under sync replication (`sync_required()` was true in this loop turn):
        what `replicated` waits on, started now so that a demotion from here on fails it
        (Master.watch)."""
        return self.master.watch(end)

    async def replicated(self, watched: Any) -> None:
        """Until the replicas acked what `watch_replicated` watched; NotEnoughReplicasError when
        they cannot, or when this broker stopped being master first."""
        await wait_replicated(watched)

    def appended(self) -> None:
        if self.is_master:
            self.master.appended()

    def copied(self, end: int) -> None:
        """A replica stored copied records: wake the pulls held on queues that grew since the last
        copy (a queue seen for the first time counts as grown). O(held queues), no record walk."""
        hold, store = self.broker.hold, self.broker.store
        for topic, qid in hold.queues():
            hi = store.queue_range(topic, qid)[1]
            if self._held_ends.get((topic, qid)) != hi:
                self._held_ends[(topic, qid)] = hi
                hold.notify(topic, qid)

    async def truncate(self, position: int) -> None:
        self.log.truncate_log(position)
        self.epochs.truncate(position)
        self._held_ends.clear()
        self.broker.hold.wake_all()

    def connection_lost(self, conn_id: int) -> None:
        self.master.connection_lost(conn_id)

    # ------------------------------------------------------------ requests
    def handlers(self) -> dict:
        return {Code.REPL_HELLO: self._as_master(self.master_call("on_hello")),
                Code.REPL_FETCH: self._as_master(self.master_call("on_fetch")),
                Code.REPL_EPOCHS: self.on_epochs,
                Code.REPL_SYNC_META: self._as_master(self.meta.on_sync_meta),
                Code.REPL_STATUS: self.on_status,
                Code.REPL_PROMOTE: self.on_promote,
                Code.REPL_DEMOTE: self.on_demote}

    def master_call(self, name: str):
        async def call(conn, frame: Frame) -> Frame:
            return await getattr(self.master, name)(conn, frame)
        return call

    def _as_master(self, handler):
        async def guarded(conn, frame: Frame) -> Frame:
            self.check_writable()  # a replica does not serve replicas
            return await handler(conn, frame)
        return guarded

    async def on_epochs(self, conn, frame: Frame) -> Frame:
        return frame.response({"epochs": [list(e) for e in self.epochs.entries],
                               "log_end": self.log.end_position(), "epoch": self.epoch})

    async def on_status(self, conn, frame: Frame) -> Frame:
        return frame.response(self.status().to_dict())

    async def on_promote(self, conn, frame: Frame) -> Frame:
        epoch = frame.header.get("epoch")
        if epoch is None:
            epoch = max(self.epoch, self.epochs.last_epoch) + 1
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise ProtocolError("header field 'epoch' must be a positive integer")
        await self.become_master(epoch)
        return frame.response(self.status().to_dict())

    async def on_demote(self, conn, frame: Frame) -> Frame:
        master = frame.header.get("master")
        epoch = frame.header.get("epoch", self.epoch)
        if not isinstance(master, str) or not master:
            raise ProtocolError("header field 'master' must be a broker address")
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise ProtocolError("header field 'epoch' must be an integer")
        await self.become_replica(master, epoch)
        return frame.response(self.status().to_dict())
