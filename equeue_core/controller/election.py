"""Who becomes master: the rules, as pure functions of the replicated state and the heartbeats.

- A group that never had a master elects among its live members the one with the highest
  (epoch, log_end) it reported (lowest broker id on a tie).
- A group whose master is lost elects among its live members that are in the last in-sync set
  (the master's own last report, plus the old master itself should it be back): the largest
  log_end wins, lowest broker id on a tie. A live replica of the lost master's epoch whose log is
  at least as long as that winner's may win too: replicas copy one master's log from its start,
  so the longer one holds every byte the shorter holds (it joined the in-sync set after the
  controller last heard). With sync replication an acknowledged message is on at least one
  in-sync replica, so the longest one has it; the controller waits for a heartbeat sent after the
  loss from each candidate (service.py) so the log ends compared are final. Nobody left: the group stays without a master
  (no unclean election) unless `unclean` allows any live member; an unclean election can lose
  acknowledged messages.
- The new epoch is one more than both the group's epoch and every epoch a member reported, so an
  epoch is never reused even by a controller that lost its memory.
"""

from __future__ import annotations

from collections.abc import Callable

from equeue_core.controller.liveness import Heartbeat
from equeue_core.controller.state import GroupState


def _best(candidates: list[Heartbeat], by_epoch: bool) -> int | None:
    if not candidates:
        return None
    best = max(candidates, key=lambda b: ((b.epoch if by_epoch else 0), b.log_end, -b.broker_id))
    return best.broker_id


def choose_master(group: GroupState | None, beats: list[Heartbeat], alive: Callable[[int], bool],
                  unclean: bool = False, exclude: int | None = None) -> int | None:
    """The broker id to elect, or None when no member may be elected."""
    live = [b for b in beats if alive(b.broker_id) and b.broker_id != exclude]
    if group is None or (group.master_id is None and group.epoch == 0):
        return _best(live, by_epoch=True)
    eligible = set(group.in_sync) | ({group.master_id} if group.master_id is not None else set())
    in_sync = [b for b in live if b.broker_id in eligible]
    chosen = _best(in_sync, by_epoch=False)
    if chosen is not None:
        floor = max(b.log_end for b in in_sync)
        longer = [b for b in live if b.role == "replica" and b.epoch == group.epoch and b.log_end > floor]
        chosen = _best(in_sync + longer, by_epoch=False)
    if chosen is None and unclean:
        chosen = _best(live, by_epoch=True)
    return chosen


def next_epoch(group: GroupState | None, beats: list[Heartbeat]) -> int:
    return max([group.epoch if group else 0, *(b.epoch for b in beats)]) + 1
