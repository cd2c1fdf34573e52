"""The engine's metadata parts: consumer offsets, topic definitions and scheduler progress are
persisted, reopened, and kept apart from each other."""

from __future__ import annotations

import threading

import pytest

from equeue_core.contracts import (
    ConsumerOffsets,
    ScheduleQueueProgress,
    SchedulerProgress,
    ScheduleState,
    TopicDefinitions,
)
from equeue_core.errors import InvalidOffsetError


def test_engine_parts_satisfy_the_kernel_contracts(harness):
    engine = harness.open().engine
    assert isinstance(engine.offsets, ConsumerOffsets)
    assert isinstance(engine.topics, TopicDefinitions)
    assert isinstance(engine.schedule, SchedulerProgress)


def test_committed_offsets_survive_persist_and_reopen(harness):
    h = harness.open()
    offsets = h.engine.offsets
    assert offsets.get("g1", "orders", 0) is None
    offsets.commit("g1", "orders", 0, 42)
    offsets.commit("g1", "orders", 1, 7)
    offsets.commit("g2", "orders", 0, 3)
    offsets.commit("g1", "orders", 0, 43)  # a later commit wins
    assert offsets.get("g1", "orders", 0) == 43
    offsets.persist()
    h.close()
    offsets = harness.open().engine.offsets
    assert offsets.all() == {("g1", "orders", 0): 43, ("g1", "orders", 1): 7, ("g2", "orders", 0): 3}


def test_offsets_committed_after_the_last_persist_are_saved_by_close(harness):
    h = harness.open()
    h.engine.offsets.commit("g", "t", 3, 11)
    h.close()
    assert harness.open().engine.offsets.get("g", "t", 3) == 11


def test_offset_reset_backwards_is_kept(harness):
    h = harness.open()
    h.engine.offsets.commit("g", "t", 0, 100)
    h.engine.offsets.commit("g", "t", 0, 5)  # admin reset to an earlier offset
    h.engine.offsets.persist()
    h.close()
    assert harness.open().engine.offsets.get("g", "t", 0) == 5


def test_delete_group_removes_only_that_group(harness):
    h = harness.open()
    offsets = h.engine.offsets
    offsets.commit("gone", "t", 0, 1)
    offsets.commit("gone", "u", 2, 2)
    offsets.commit("kept", "t", 0, 3)
    offsets.commit("gone-too-similar", "t", 0, 4)
    offsets.persist()
    offsets.delete_group("gone")
    assert offsets.get("gone", "t", 0) is None
    h.close()
    offsets = harness.open().engine.offsets
    assert offsets.all() == {("kept", "t", 0): 3, ("gone-too-similar", "t", 0): 4}


def test_commits_and_group_deletions_racing_persists_lose_nothing_and_the_last_value_wins(harness):
    """The broker commits on its loop thread while a worker persists (and a persist's write may
    run outside the lock commits take): whatever a persist took, a later commit's value, and a
    deletion after a commit, are what the store has at the end."""
    h = harness.open()
    offsets = h.engine.offsets
    stop = threading.Event()
    failures: list[BaseException] = []

    def persist_until_stopped() -> None:
        try:
            for _ in range(100_000):
                if stop.is_set():
                    return
                offsets.persist()
        except BaseException as e:  # the test thread asserts on it
            failures.append(e)

    worker = threading.Thread(target=persist_until_stopped)
    worker.start()
    try:
        for i in range(1, 2001):
            offsets.commit("g", "t", i % 40, i)
            if i % 100 == 0:
                offsets.commit("gone", "t", 0, i)
                offsets.delete_group("gone")
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive() and not failures, failures
    offsets.persist()
    h.close()
    got = harness.open().engine.offsets.all()
    assert got == {("g", "t", q): 2000 - (2000 - q) % 40 for q in range(40)}


@pytest.mark.parametrize("bad", [("g", "t", -1, 5), ("g", "t", 0, -1), ("g", "t", 0, 1 << 64),
                                 ("g", "t", 1 << 40, 5), ("g" * 70_000, "t", 0, 5), ("", "t", 0, 5)])
def test_an_offset_the_store_cannot_keep_is_refused_and_the_others_are_saved(harness, bad):
    h = harness.open()
    offsets = h.engine.offsets
    offsets.commit("good", "t", 0, 10)
    with pytest.raises(InvalidOffsetError):
        offsets.commit(*bad)
    offsets.commit("good", "t", 1, 20)
    offsets.persist()
    h.close()
    assert harness.open().engine.offsets.all() == {("good", "t", 0): 10, ("good", "t", 1): 20}


def test_topic_definitions_survive_reopen(harness):
    h = harness.open()
    assert h.engine.topics.load() == {}
    h.engine.topics.save({"orders": 4, "%SCHEDULE%": 19})
    h.engine.topics.save({"orders": 8, "%SCHEDULE%": 19})
    h.close()
    assert harness.open().engine.topics.load() == {"orders": 8, "%SCHEDULE%": 19}


def test_scheduler_progress_survives_reopen_and_is_not_a_consumer_offset(harness):
    h = harness.open()
    assert h.engine.schedule.load() == ScheduleState()
    saved = ScheduleState({("%SCHEDULE%", 0): ScheduleQueueProgress(5, frozenset({7, 9})),
                           ("%TIMER%", 18): ScheduleQueueProgress(0)},
                          timer_open_from=1_700_000_000_000, timer_bucket_ms=3_600_000, timer_buckets=962)
    h.engine.schedule.save(saved)
    h.close()
    engine = harness.open().engine
    assert engine.schedule.load() == saved
    assert engine.offsets.all() == {}
