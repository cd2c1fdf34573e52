"""The election rules (controller/election.py) and the agent's handling of decisions
(broker/controller_agent.py), as plain functions: no processes needed."""

from __future__ import annotations

import asyncio

from equeue_core.broker.controller_agent import ControllerAgent
from equeue_core.controller.election import choose_master, next_epoch
from equeue_core.controller.liveness import Heartbeat
from equeue_core.controller.state import ControllerState, GroupState
from tests.helpers.controller import ScriptedReplication


def beat(broker_id: int, log_end: int, epoch: int = 3, role: str = "replica") -> Heartbeat:
    return Heartbeat("c1", "broker-a", broker_id, f"tcp://127.0.0.1:{20000 + broker_id}", role, epoch, log_end)


def group(master: int | None, epoch: int, in_sync: set[int], members: int = 3) -> GroupState:
    return GroupState("c1", "broker-a", {i: f"tcp://127.0.0.1:{20000 + i}" for i in range(members)}, master, epoch,
                      in_sync)


def alive_except(*dead: int):
    return lambda i: i not in dead


def test_a_lost_master_is_replaced_by_the_longest_live_in_sync_replica():
    g = group(0, 3, {1, 2})
    assert choose_master(g, [beat(0, 900), beat(1, 500), beat(2, 700)], alive_except(0)) == 2
    assert choose_master(g, [beat(0, 900), beat(1, 700), beat(2, 700)], alive_except(0)) == 1  # tie: lowest id


def test_a_replica_outside_the_in_sync_set_is_never_elected_unless_unclean():
    g = group(0, 3, {1})
    beats = [beat(0, 900), beat(1, 500), beat(2, 700, epoch=2)]  # 2 follows an older epoch: not in sync
    assert choose_master(g, beats, alive_except(0)) == 1
    assert choose_master(g, beats, alive_except(0, 1)) is None
    assert choose_master(g, beats, alive_except(0, 1), unclean=True) == 2


def test_a_replica_of_the_current_epoch_longer_than_every_in_sync_one_wins():
    """It joined the in-sync set after the controller last heard; sync acks may be on it only."""
    g = group(0, 3, {1})
    assert choose_master(g, [beat(0, 900), beat(1, 500), beat(2, 800)], alive_except(0)) == 2


def test_a_new_group_elects_the_member_with_the_highest_epoch_then_longest_log():
    beats = [beat(0, 900, epoch=1), beat(1, 100, epoch=4), beat(2, 500, epoch=4)]
    assert choose_master(None, beats, alive_except()) == 2
    assert next_epoch(None, beats) == 5


def test_an_epoch_is_never_reused_even_below_what_a_broker_reported():
    assert next_epoch(group(0, 3, {1}), [beat(1, 0, epoch=9)]) == 10


def test_an_election_from_a_stale_view_changes_nothing():
    s = ControllerState()
    for i in range(3):
        s.apply_member("c1", "broker-a", i, f"tcp://h:{i}")
    assert s.apply_elect("c1", "broker-a", 0, 0, 1)["applied"]
    assert s.apply_elect("c1", "broker-a", 1, 1, 2)["applied"]
    late = s.apply_elect("c1", "broker-a", 1, 2, 2)  # decided while the group was still at epoch 1
    assert not late["applied"] and (late["master_id"], late["epoch"]) == (1, 2)
    assert not s.apply_in_sync("c1", "broker-a", 1, 0, [2])  # an old master's report is ignored
    assert s.apply_in_sync("c1", "broker-a", 2, 1, [0, 2]) and s.group("c1", "broker-a").in_sync == {0, 2}


def test_the_agent_ignores_a_decision_of_an_older_epoch_than_its_broker():
    async def go() -> tuple[bool, bool, list]:
        repl = ScriptedReplication(1, role="replica", epoch=5, master_address="tcp://h:2")
        agent = ControllerAgent("c1", "broker-a", 1, "tcp://h:1", [], 1.0, repl)
        stale = await agent.apply({"master_id": 1, "epoch": 4, "master_address": "tcp://h:1"})
        fresh = await agent.apply({"master_id": 1, "epoch": 6, "master_address": "tcp://h:1"})
        return stale, fresh, repl.calls

    stale, fresh, calls = asyncio.run(go())
    assert (stale, fresh, calls) == (False, True, [("master", 6)])


def test_the_agent_follows_a_new_master_of_the_same_epoch_after_its_broker_restarted():
    async def go() -> list:
        repl = ScriptedReplication(1, role="replica", epoch=5, master_address=None)  # restarted: no master yet
        agent = ControllerAgent("c1", "broker-a", 1, "tcp://h:1", [], 1.0, repl)
        await agent.apply({"master_id": 0, "epoch": 5, "master_address": "tcp://h:0"})
        await agent.apply({"master_id": 0, "epoch": 5, "master_address": "tcp://h:0"})  # already done: no call
        return repl.calls

    assert asyncio.run(go()) == [("replica", "tcp://h:0", 5)]
