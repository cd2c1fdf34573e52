"""The Raft group of the controllers (pysyncobj) and its bridge to the name server's event loop.

pysyncobj runs its own thread (autoTick): it ticks elections, ships log entries and calls the
`@replicated` methods below on every peer, in log order, once an entry is committed by a majority.
The event loop never blocks on it: `propose` hands the entry to pysyncobj with a callback, and the
callback (on pysyncobj's thread) resolves an asyncio future through `loop.call_soon_threadsafe`.

Choices (docs/controller.md, "Raft"):
- The log lives in memory (no journal or dump files). pysyncobj's file journal is flushed once a
  second and keeps no term or vote, so it would not give Raft's durability promise anyway; the
  state is small and a restarted peer gets all of it from the leader. The backstop is on the
  brokers: each keeps its epoch on disk and reports it, and the controller never elects at or
  below an epoch a broker reported, so even a controller that forgot everything never reuses one.
- Membership is fixed (dynamicMembershipChange off): the peers are the name servers started with
  the same `--controller-peers`.
- appendEntriesUseBatch off: decisions are rare and each should commit at once, not wait for a batch.
- leaderFallbackTimeout is short (2 s instead of pysyncobj's 30 s): a leader cut off from the
  majority stops calling itself leader soon; it could not commit a decision anyway.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from equeue_core.controller.state import ControllerState
from equeue_core.errors import NoQuorumError, NotLeaderError

log = logging.getLogger("equeue.controller")

COMMIT_TIMEOUT_S = 4.0  # a proposal not committed by then: no majority answers


def raft_conf() -> SyncObjConf:
    return SyncObjConf(dynamicMembershipChange=False, appendEntriesUseBatch=False, commandsWaitLeader=False,
                       raftMinTimeout=0.6, raftMaxTimeout=1.5, appendEntriesPeriod=0.15,
                       connectionTimeout=3.0, connectionRetryTime=0.5, leaderFallbackTimeout=2.0,
                       fullDumpFile=None, journalFile=None)


class RaftState(SyncObj):
    """The replicated ControllerState. Call the `@replicated` methods only through `propose`."""

    def __init__(self, self_address: str, partners: list[str], state: ControllerState,
                 conf: SyncObjConf | None = None) -> None:
        self.state = state
        super().__init__(self_address, partners, conf or raft_conf())

    @replicated
    def member(self, cluster: str, name: str, broker_id: int, address: str) -> bool:
        return self.state.apply_member(cluster, name, broker_id, address)

    @replicated
    def elect(self, cluster: str, name: str, expected_epoch: int, master_id: int, new_epoch: int) -> dict:
        return self.state.apply_elect(cluster, name, expected_epoch, master_id, new_epoch)

    @replicated
    def in_sync(self, cluster: str, name: str, epoch: int, master_id: int, in_sync: list[int]) -> bool:
        return self.state.apply_in_sync(cluster, name, epoch, master_id, in_sync)

    # ------------------------------------------------------------ status (any thread)

    def leader_address(self) -> str:
        leader = self._getLeader()
        return "" if leader is None else str(getattr(leader, "address", leader))

    def is_leader(self) -> bool:
        return bool(self._isLeader())

    def status(self) -> dict[str, Any]:
        s = self.getStatus()
        peers = {k[len("partner_node_status_server_"):]: v == 2 for k, v in s.items()
                 if k.startswith("partner_node_status_server_")}
        return {"self": str(getattr(s["self"], "address", s["self"])), "leader": self.leader_address(),
                "state": {0: "follower", 1: "candidate", 2: "leader"}.get(s["state"], str(s["state"])),
                "term": s["raft_term"], "has_quorum": bool(s["has_quorum"]), "commit_idx": s["commit_idx"],
                "peers": peers}


async def propose(raft: RaftState, method: str, *args: Any, timeout: float = COMMIT_TIMEOUT_S) -> Any:
    """Commit one entry and return what its apply returned. NotLeaderError (naming the leader) when
    this peer is not the leader, NoQuorumError when no majority commits it within `timeout`."""
    if not raft.is_leader():
        raise NotLeaderError(f"this controller is not the Raft leader; ask {raft.leader_address() or 'another'}",
                             leader=raft.leader_address())
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def done(result: Any, error: int) -> None:  # pysyncobj's thread
        def settle() -> None:
            if fut.done():
                return
            if error == FAIL_REASON.SUCCESS:
                fut.set_result(result)
            elif error in (FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.MISSING_LEADER,
                           FAIL_REASON.DISCARDED):
                fut.set_exception(NotLeaderError(f"leadership moved while committing {method} (reason {error})",
                                                 leader=raft.leader_address()))
            else:
                fut.set_exception(NoQuorumError(f"controller could not commit {method} (reason {error})"))

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed while the entry was in flight: nobody waits for it
            pass

    getattr(raft, method)(*args, callback=done)
    try:
        return await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise NoQuorumError(f"controller could not commit {method} within {timeout:g}s: no majority of its "
                            "peers answers") from None
