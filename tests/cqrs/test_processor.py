"""CommandProcessor, CommandBus and EventConsumer against a real broker process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from equeue_cqrs import (
    CommandBus,
    CommandFailedError,
    CommandProcessor,
    EventConsumer,
    Projection,
    event_handler,
)
from equeue_cqrs.store import open_event_store

from tests.helpers.broker import start_broker

from . import domain as d
from .conftest import numbers_of

ROOT = Path(__file__).resolve().parents[2]


class NumberTotals(Projection):
    """An in-memory read model: each log's numbers, applying each event id once, and how many
    times each event id was delivered (at least once means some may come twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: dict[str, list[int]] = {}
        self.deliveries: Counter[str] = Counter()
        self.lock = threading.Lock()

    def project(self, items) -> None:
        with self.lock:
            for _event, meta in items:
                self.deliveries[meta.event_id] += 1
            super().project(items)

    @event_handler(d.NumberAppended)
    def _appended(self, event: d.NumberAppended, meta) -> None:
        self.numbers.setdefault(meta.aggregate_id, []).append(event.n)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture
def broker(tmp_path):
    with start_broker(tmp_path) as b:
        yield b


def test_send_returns_when_persisted_and_order_per_aggregate_holds_through_the_broker(broker, event_store):
    projection = NumberTotals()
    with CommandProcessor(broker.address, event_store, [d], workers=4, pull_batch=8).start() as processor, \
            EventConsumer(broker.address, "totals", projection).start(), CommandBus(broker.address) as bus:
        result = bus.send(d.StartLog(aggregate_id="solo"))
        assert result.ok and result.version == 1
        assert [e.version for e in event_store.read_events("solo")] == [1]  # persisted before send returned
        with pytest.raises(CommandFailedError, match="already exists"):
            bus.send(d.StartLog(aggregate_id="solo"))
        logs = [f"log-{i}" for i in range(12)]
        for f in [bus.submit(d.StartLog(aggregate_id=a)) for a in logs]:
            assert f.result(60).ok
        futures = [bus.submit(d.AppendNumber(aggregate_id=a, n=n)) for n in range(50) for a in logs]
        assert all(f.result(60).ok for f in futures)
        for a in logs:
            assert numbers_of(event_store, a) == list(range(50))
        wait_for(lambda: all(projection.numbers.get(a) == list(range(50)) for a in logs), 60, "the projection")
        assert processor.stats["handled"] >= 12 * 51


def test_send_async_does_not_wait_and_the_command_is_still_handled(broker, event_store):
    with CommandProcessor(broker.address, event_store, [d]).start(), CommandBus(broker.address) as bus:
        bus.send(d.StartLog(aggregate_id="a"))
        sent = bus.send_async(d.AppendNumber(aggregate_id="a", n=7)).result(30)
        assert sent.topic == "commands"
        wait_for(lambda: len(event_store.read_events("a")) == 2, 30, "the command to be persisted")


def test_two_processors_that_both_own_every_aggregate_apply_each_command_once(broker, event_store):
    """Forced double ownership: two processors in two consumer groups both consume every command.
    Each command is applied once (the loser of each race hits a version conflict or finds the
    command id stored), versions stay contiguous, and the stored history replays to the state a
    serial run of it gives; the projection sees every event once."""
    projection = NumberTotals()
    first = CommandProcessor(broker.address, event_store, [d], group="owner-a", workers=2).start()
    second = CommandProcessor(broker.address, event_store, [d], group="owner-b", workers=2).start()
    try:
        with EventConsumer(broker.address, "totals", projection).start(), CommandBus(broker.address) as bus:
            logs = [f"log-{i}" for i in range(6)]
            for f in [bus.submit(d.StartLog(aggregate_id=a)) for a in logs]:
                f.result(60)
            wait_for(lambda: first.engine.in_flight() == 0 and second.engine.in_flight() == 0, 60, "both idle")
            # Force the double ownership: each engine writes once behind the other's back, so both
            # hold every log in memory and the second one's copy is already stale.
            for engine, n in ((second.engine, -1), (first.engine, -2)):
                for a in logs:
                    engine.submit(d.AppendNumber(aggregate_id=a, n=n), lambda _r: None)
                assert engine.wait_idle(30)
            commands = [d.AppendNumber(aggregate_id=a, n=n) for n in range(150) for a in logs]
            futures = [bus.submit(c) for c in commands]
            assert all(f.result(60).ok for f in futures)
            # both processors finish their copy of every command
            wait_for(lambda: first.engine.in_flight() == 0 and second.engine.in_flight() == 0, 60, "both idle")
            for a in logs:
                stored = numbers_of(event_store, a)
                assert stored == [-1, -2, *range(150)]  # one sender, so one order; each number once
                loaded = first.engine.load(d.NumberLog, a)
                assert loaded.numbers == stored and loaded.total == sum(stored)
            races = sum(p.stats["conflicts"] + p.stats["duplicates"] for p in (first, second))
            assert races >= len(commands)  # every command was a race one of them lost
            assert first.stats["conflicts"] + second.stats["conflicts"] > 0
            # the projection applied every stored event once, in version order
            wait_for(lambda: all(projection.numbers.get(a) == numbers_of(event_store, a) for a in logs), 60,
                     "the projection")
    finally:
        first.close()
        second.close()


@pytest.mark.failure
@pytest.mark.parametrize("store_name", ["lmdb", "rocksdb"])
def test_kill_9_of_a_processor_mid_batch_applies_every_accepted_command_exactly_once(broker, tmp_path, store_name):
    path = str(tmp_path / "events")
    projection = NumberTotals()

    def start_processor() -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", "tests.cqrs.processor_main", broker.address, store_name, path],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    proc = start_processor()
    try:
        with EventConsumer(broker.address, "totals", projection).start(), CommandBus(broker.address) as bus:
            logs = [f"log-{i}" for i in range(10)]
            for f in [bus.submit(d.StartLog(aggregate_id=a)) for a in logs]:
                f.result(60)
            commands = [d.AppendNumber(aggregate_id=a, n=n) for n in range(400) for a in logs]
            for f in [bus.send_async(c) for c in commands]:
                f.result(60)  # accepted by the broker
            wait_for(lambda: len(projection.deliveries) >= 500, 60, "processing to be under way")
            proc.kill()  # kill -9 while batches are being persisted and published
            proc.wait(10)
            assert len(projection.deliveries) < len(commands) + len(logs), "the kill came too late to test anything"
            proc = start_processor()
            wait_for(lambda: sum(len(v) for v in projection.numbers.values()) >= len(commands), 120,
                     "every command's event to reach the projection")
        proc.terminate()
        stats = json.loads(proc.communicate(timeout=60)[0].strip().splitlines()[-1])
        assert stats["duplicates"] > 0  # the restarted processor got commands the first had persisted
        store = open_event_store(store_name, path)
        try:
            for a in logs:
                assert numbers_of(store, a) == list(range(400))  # each command applied once, in order
                assert projection.numbers[a] == list(range(400))  # the projection converged, no duplicates
            assert len(store.command_results([c.command_id for c in commands])) == len(commands)
            assert set(projection.deliveries) == {e.event_id for e in store.iter_events()
                                                  if e.type == "NumberAppended"} | {
                e.event_id for e in store.iter_events() if e.type == "LogStarted"}
        finally:
            store.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_send_without_a_processor_times_out_with_a_typed_error(broker):
    from equeue_cqrs import CommandTimeoutError

    with CommandBus(broker.address) as bus, pytest.raises(CommandTimeoutError, match="no result"):
        bus.send(d.StartLog(aggregate_id="a"), timeout=1.0)


def test_an_undecodable_command_message_is_consumed_and_the_queue_goes_on(broker, event_store):
    from equeue_core.client import Message, Producer

    with CommandProcessor(broker.address, event_store, [d]).start(), CommandBus(broker.address) as bus:
        with Producer(broker.address) as producer:
            producer.send(Message("commands", b"\xc1not msgpack", tag="NoSuchCommand"), routing_key="a")
            producer.send(Message("commands", b"\xc1not msgpack", tag="AppendNumber"), routing_key="a")
        assert bus.send(d.StartLog(aggregate_id="a")).version == 1


def test_a_command_type_without_a_handler_fails_with_a_clear_message(broker, event_store):
    with CommandProcessor(broker.address, event_store, [d.start_log]).start(), CommandBus(broker.address) as bus:
        with pytest.raises(CommandFailedError, match="no @command_handler for AppendNumber"):
            bus.send(d.AppendNumber(aggregate_id="a", n=1))


def test_queues_moving_between_processors_of_one_group_keep_order_and_apply_each_command_once(broker, event_store):
    """A second processor joins the group mid-stream and the first leaves: queues move twice while
    commands are in flight. Every command is applied once, each log's numbers in send order."""
    first = CommandProcessor(broker.address, event_store, [d], group="movers").start()
    second = None
    try:
        with CommandBus(broker.address) as bus:
            logs = [f"log-{i}" for i in range(16)]
            for f in [bus.submit(d.StartLog(aggregate_id=a)) for a in logs]:
                f.result(60)
            commands = [d.AppendNumber(aggregate_id=a, n=n) for n in range(120) for a in logs]
            futures = [bus.submit(c) for c in commands[:600]]
            second = CommandProcessor(broker.address, event_store, [d], group="movers").start()
            futures += [bus.submit(c) for c in commands[600:1200]]
            wait_for(lambda: sum(f.done() for f in futures) >= 300, 60, "some results")
            first.close()  # its queues move to the second; what it had in flight comes back there
            futures += [bus.submit(c) for c in commands[1200:]]
            assert all(f.result(60).ok for f in futures)
            for a in logs:
                assert numbers_of(event_store, a) == list(range(120))
            assert second.stats["handled"] > 0 and first.stats["handled"] > 0
    finally:
        first.close()
        if second is not None:
            second.close()
