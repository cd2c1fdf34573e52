"""The command engine without a broker: mailboxes over a worker pool plus a real event store."""

from __future__ import annotations

import threading
import time

import pytest
from equeue_cqrs import CommandEngine, CommandResult
from equeue_cqrs.store import EventBatch, Snapshot, StoredEvent

from . import domain as d
from .conftest import numbers_of


class Results:
    """Collects results by command id (callbacks arrive on worker threads)."""

    def __init__(self) -> None:
        self.by_id: dict[str, CommandResult] = {}
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, result: CommandResult) -> None:
        with self.lock:
            self.by_id[result.command_id] = result
            self.count += 1


def run(engine: CommandEngine, commands, results: Results | None = None) -> Results:
    results = results or Results()
    for c in commands:
        engine.submit(c, results)
    assert engine.wait_idle(60)
    return results


def test_order_per_aggregate_holds_under_a_pool_of_workers(event_store):
    engine = CommandEngine(event_store, [d], workers=4, event_mailboxes=3, command_batch=7, event_batch=50)
    try:
        logs = [f"log-{i}" for i in range(40)]
        run(engine, [d.StartLog(aggregate_id=a) for a in logs])
        commands = [d.AppendNumber(aggregate_id=a, n=n) for n in range(60) for a in logs]
        results = run(engine, commands)
        assert all(r.ok for r in results.by_id.values())
        for a in logs:
            assert numbers_of(event_store, a) == list(range(60))  # persisted in send order, versions 1..61
        mine = [results.by_id[c.command_id].version for c in commands if c.aggregate_id == "log-7"]
        assert mine == list(range(2, 62))
    finally:
        engine.close()


def test_a_handler_that_fails_after_raising_leaves_no_trace(event_store):
    engine = CommandEngine(event_store, [d], workers=2)
    try:
        run(engine, [d.StartLog(aggregate_id="a"), d.AppendNumber(aggregate_id="a", n=1)])
        failing = d.FailAfterRaising(aggregate_id="a", n=99)
        after = d.AppendNumber(aggregate_id="a", n=2)
        results = run(engine, [failing, after])
        assert results.by_id[failing.command_id].status == "failed"
        assert "changed my mind" in results.by_id[failing.command_id].message
        assert results.by_id[after.command_id].version == 3
        assert numbers_of(event_store, "a") == [1, 2]
        assert engine.load(d.NumberLog, "a").numbers == [1, 2]
    finally:
        engine.close()


def test_a_command_for_a_missing_aggregate_fails_with_a_clear_message(event_store):
    engine = CommandEngine(event_store, [d])
    try:
        c = d.AppendNumber(aggregate_id="nobody", n=1)
        result = run(engine, [c]).by_id[c.command_id]
        assert result.status == "failed" and "does not exist" in result.message
    finally:
        engine.close()


@pytest.mark.parametrize("warm", [False, True], ids=["cold-mailbox", "warm-mailbox"])
def test_a_duplicate_command_id_is_answered_from_the_stored_result_and_applied_once(event_store, warm):
    engine = CommandEngine(event_store, [d])
    try:
        run(engine, [d.StartLog(aggregate_id="a")])
        first = d.AppendNumber(aggregate_id="a", n=5)
        run(engine, [first])
        if not warm:  # a fresh engine (a restart): the mailbox is cold
            engine.close()
            engine = CommandEngine(event_store, [d])
        again = d.AppendNumber(aggregate_id="a", n=5, command_id=first.command_id)
        nxt = d.AppendNumber(aggregate_id="a", n=6)
        results = run(engine, [again, nxt])
        assert results.by_id[first.command_id].version == 2  # the stored result, not a new one
        assert results.by_id[nxt.command_id].version == 3
        assert numbers_of(event_store, "a") == [5, 6]
        assert engine.stats["duplicates"] == 1
    finally:
        engine.close()


def test_a_command_id_sent_twice_at_once_is_handled_once(event_store):
    engine = CommandEngine(event_store, [d], workers=1)
    try:
        run(engine, [d.StartLog(aggregate_id="a")])
        c = d.AppendNumber(aggregate_id="a", n=1)
        results = Results()
        engine.submit(c, results)
        engine.submit(d.AppendNumber(aggregate_id="a", n=1, command_id=c.command_id), results)
        assert engine.wait_idle(30)
        assert results.count == 2
        assert numbers_of(event_store, "a") == [1]
    finally:
        engine.close()


def test_a_version_written_by_someone_else_resets_the_mailbox_and_nothing_is_lost(event_store):
    """Another writer appends version 3 behind the engine's back: the engine's next command hits
    the conflict, reloads the aggregate, and handles the command again on the true state."""
    from equeue_cqrs.messages import encode, event_id

    engine = CommandEngine(event_store, [d])
    try:
        run(engine, [d.StartLog(aggregate_id="a"), d.AppendNumber(aggregate_id="a", n=1)])
        event_store.append(EventBatch([StoredEvent("a", 3, "intruder", event_id("a", 3), "NumberAppended",
                                                   encode(d.NumberAppended(100)), 0)]))
        c = d.AppendNumber(aggregate_id="a", n=2)
        result = run(engine, [c]).by_id[c.command_id]
        assert result.ok and result.version == 4
        assert numbers_of(event_store, "a") == [1, 100, 2]
        assert engine.stats["conflicts"] == 1 and engine.stats["resets"] == 1
    finally:
        engine.close()


def test_two_engines_that_both_own_an_aggregate_converge_to_a_serial_run(event_store):
    """Forced double ownership: both engines hold the same aggregates in memory and get commands
    for them alternately. Losers hit version conflicts, reload and replay; every command is
    applied exactly once, and replaying the stored events gives what a serial run of the same
    commands in stored order gives."""
    first = CommandEngine(event_store, [d], workers=2, event_batch=8)
    second = CommandEngine(event_store, [d], workers=2, event_batch=8)
    try:
        logs = [f"log-{i}" for i in range(5)]
        run(first, [d.StartLog(aggregate_id=a) for a in logs])
        run(second, [d.AppendNumber(aggregate_id=a, n=-1) for a in logs])  # both now warm
        run(first, [d.AppendNumber(aggregate_id=a, n=-2) for a in logs])
        commands = [d.AppendNumber(aggregate_id=a, n=n) for n in range(200) for a in logs]
        r1, r2 = Results(), Results()
        for i, c in enumerate(commands):
            (first if i % 2 else second).submit(c, r1 if i % 2 else r2)
        assert first.wait_idle(60) and second.wait_idle(60)
        assert all(r.ok for r in [*r1.by_id.values(), *r2.by_id.values()])
        assert first.stats["conflicts"] + second.stats["conflicts"] > 0
        for a in logs:
            stored = numbers_of(event_store, a)  # versions contiguous: nothing lost, nothing twice
            assert sorted(stored) == [-2, -1, *range(200)]
            serial = d.NumberLog.empty(a)
            for n in stored:
                serial.apply(d.NumberAppended(n))
            loaded = first.load(d.NumberLog, a)
            assert (loaded.numbers, loaded.total) == (serial.numbers, serial.total)
    finally:
        first.close()
        second.close()


def test_an_aggregate_reloads_from_its_snapshot_plus_the_events_after_it(event_store):
    engine = CommandEngine(event_store, [d], snapshot_every=10)
    try:
        run(engine, [d.StartLog(aggregate_id="a"), *[d.AppendNumber(aggregate_id="a", n=n) for n in range(24)]])
        snapshot = event_store.load_snapshot("a")
        assert snapshot is not None and snapshot.version == 20
        partial = d.NumberLog.empty("a")
        partial.restore_state(snapshot.state)
        assert partial.numbers == list(range(19))  # StartLog + 19 appends = version 20
        loaded = engine.load(d.NumberLog, "a")
        assert loaded.version == 25 and loaded.numbers == list(range(24))
        # A (doctored) newer snapshot is where loading starts: the state comes from it, and only
        # the events after it are replayed on top.
        doctored = d.NumberLog.empty("a")
        doctored.numbers, doctored.total = [42], 42
        event_store.append(EventBatch(snapshots=[Snapshot("a", 24, doctored.snapshot_state())]))
        loaded = engine.load(d.NumberLog, "a")
        assert (loaded.version, loaded.numbers, loaded.total) == (25, [42, 23], 65)
    finally:
        engine.close()


def test_idle_aggregates_are_forgotten_and_reload_from_the_store_when_they_come_back(event_store):
    engine = CommandEngine(event_store, [d], max_idle_seconds=0.2, snapshot_every=3)
    try:
        logs = [f"log-{i}" for i in range(30)]
        run(engine, [d.StartLog(aggregate_id=a) for a in logs])
        run(engine, [d.AppendNumber(aggregate_id=a, n=n) for n in range(4) for a in logs])
        assert len(engine.mailboxes) == 30
        time.sleep(0.5)
        run(engine, [d.AppendNumber(aggregate_id="log-0", n=4)])  # a submit sweeps idle mailboxes
        assert engine.stats["evicted"] >= 29 and len(engine.mailboxes) <= 2
        results = run(engine, [d.AppendNumber(aggregate_id=a, n=5) for a in logs])
        assert {r.version for r in results.by_id.values() if r.aggregate_id != "log-0"} == {6}
        for a in logs:
            assert numbers_of(event_store, a) == ([0, 1, 2, 3, 4, 5] if a == "log-0" else [0, 1, 2, 3, 5])
    finally:
        engine.close()
