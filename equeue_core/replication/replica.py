"""The replica's side: connect to the master, find where the logs agree, copy from there.

One task per become_replica. It connects with the normal client transport (so a `tls://` master
address uses the broker's link_* credentials: link_tls_ca and the rest, docs/security.md), says hello (the master refuses another broker
group or a replica whose epoch is ahead), asks the master's epoch list, truncates its own log
past the last point both logs agree on (epochs.divergence_point), then fetches from its end in a
loop: each fetch reports that end, which is the master's acknowledgement. Every second it also
syncs consumer offsets and topics (sync_meta.py). Any failure closes the connection and retries
after RETRY_S; a refusal (wrong group, epoch ahead) is logged as an error and retried slowly,
and nothing is copied meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from equeue_core.codes import Code
from equeue_core.contracts import TransportSettings
from equeue_core.errors import EQueueError, ReplicaRefusedError, StoreError
from equeue_core.replication.epochs import divergence_point

if TYPE_CHECKING:
    from equeue_core.replication.replication import Replication

log = logging.getLogger("equeue.replication")

RETRY_S = 1.0
REFUSED_RETRY_S = 5.0
FETCH_WAIT_MS = 1000
FETCH_BYTES = 4 * 1024 * 1024
META_EVERY_S = 1.0


class ReplicaCopier:
    def __init__(self, repl: Replication, master_address: str) -> None:
        self.repl = repl
        self.master_address = master_address
        self.connected = False
        self.master_epoch = 0
        self._task: asyncio.Task | None = None
        self._conn = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._close()

    async def _close(self) -> None:
        self.connected = False
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                await conn.close()
            except Exception:
                pass

    async def _run(self) -> None:
        refused_logged = ""
        while True:
            try:
                await self._copy()
            except asyncio.CancelledError:
                raise
            except ReplicaRefusedError as e:
                if str(e) != refused_logged:
                    log.error("replication from %s refused: %s; nothing is copied", self.master_address, e)
                    refused_logged = str(e)
                await self._close()
                await asyncio.sleep(REFUSED_RETRY_S)
                continue
            except (EQueueError, OSError) as e:
                log.warning("replication from %s stopped: %s; retrying", self.master_address, e)
            except Exception:
                log.exception("replication from %s failed; retrying", self.master_address)
            await self._close()
            await asyncio.sleep(RETRY_S)

    async def _copy(self) -> None:
        from equeue_core.client.connection import BrokerConnection
        from equeue_core.client.credentials import client_link

        repl = self.repl
        cfg = repl.config
        link = client_link(cfg, TransportSettings(max_frame_size=cfg.max_frame_size))
        self._conn = conn = await BrokerConnection(self.master_address, link=link).connect()
        hello = (await conn.request(Code.REPL_HELLO, {
            "cluster": cfg.cluster, "name": cfg.broker_name, "broker_id": cfg.broker_id,
            "epoch": repl.epochs.last_epoch, "address": repl.own_address()}, timeout=10)).header
        self.master_epoch = int(hello["epoch"])
        repl.epoch = max(repl.epoch, self.master_epoch)
        theirs = [(int(e), int(s)) for e, s in hello["epochs"]]
        await self._truncate_to_agreement(theirs, int(hello["log_end"]))
        self.connected = True
        log.info("replica of %s (epoch %d) from position %d", self.master_address, self.master_epoch,
                 repl.log.end_position())
        next_meta = 0.0
        while True:
            end = repl.log.end_position()
            resp = await conn.request(Code.REPL_FETCH, {"broker_id": cfg.broker_id, "position": end,
                                                        "max_bytes": min(FETCH_BYTES, cfg.max_frame_size // 2), "wait_ms": FETCH_WAIT_MS},
                                      timeout=30)
            self.master_epoch = int(resp.header.get("epoch", self.master_epoch))
            repl.epoch = max(repl.epoch, self.master_epoch)
            if resp.body:
                new_end = repl.log.append_log(end, resp.body)
                repl.copied(new_end)
            self._copy_epochs([(int(e), int(s)) for e, s in resp.header.get("epochs", [])])
            if time.monotonic() >= next_meta:
                next_meta = time.monotonic() + META_EVERY_S
                await repl.meta.sync_with(conn)

    async def _truncate_to_agreement(self, theirs: list[tuple[int, int]], their_end: int) -> None:
        repl = self.repl
        mine = list(repl.epochs.entries)
        my_end = repl.log.end_position()
        if mine and theirs and mine[-1][0] > theirs[-1][0]:
            raise ReplicaRefusedError(f"this replica's epoch {mine[-1][0]} is ahead of the master's {theirs[-1][0]}")
        cut = divergence_point(mine, my_end, theirs, their_end)
        if cut < my_end:
            log.warning("log diverges from master %s at position %d: truncating %d bytes (epochs here %s, "
                        "master %s)", self.master_address, cut, my_end - cut, mine, theirs)
            try:
                await repl.truncate(cut)
            except StoreError as e:
                raise ReplicaRefusedError(f"cannot truncate to the master's history at {cut}: {e}") from e
        self._copy_epochs(theirs)

    def _copy_epochs(self, theirs: list[tuple[int, int]]) -> None:
        """Take the master's epoch entries that start at or below this log's end."""
        end = self.repl.log.end_position()
        for epoch, start in theirs:
            if start <= end and epoch > self.repl.epochs.last_epoch:
                self.repl.epochs.begin(epoch, start)
