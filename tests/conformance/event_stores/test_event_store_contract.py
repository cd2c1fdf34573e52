"""The event store contract: every `equeue_event_stores` plugin passes these (see equeue_cqrs/store.py)."""

from __future__ import annotations

import pytest
from equeue_cqrs.errors import DuplicateCommandError, EventStoreError, VersionConflictError
from equeue_cqrs.store import CommandRecord, EventBatch, EventStore, Snapshot, StoredEvent


def ev(agg: str, version: int, command: str = "c", payload: bytes = b"p") -> StoredEvent:
    return StoredEvent(agg, version, command, f"{agg}-{version}-{command}", "Happened", payload, 1000 + version)


def cmd(command: str, agg: str, first: int = 0, last: int = 0) -> CommandRecord:
    return CommandRecord(command, agg, first, last, f"result-of-{command}".encode())


def test_the_factory_makes_an_event_store(open_store):
    assert isinstance(open_store(), EventStore)


def test_appended_events_read_back_in_version_order_from_a_version(open_store):
    s = open_store()
    s.append(EventBatch([ev("a", 1, "c1"), ev("a", 2, "c1"), ev("b", 1, "c2")], [cmd("c1", "a", 1, 2)]))
    s.append(EventBatch([ev("a", 3, "c3")], [cmd("c3", "a", 3, 3)]))
    assert [e.version for e in s.read_events("a")] == [1, 2, 3]
    assert [e.version for e in s.read_events("a", 2)] == [2, 3]
    assert [e.version for e in s.read_events("a", 1, 2)] == [1, 2]
    assert s.read_events("a", 1)[0] == ev("a", 1, "c1")
    assert s.read_events("nobody") == []


def test_an_aggregate_id_that_prefixes_another_does_not_see_its_events(open_store):
    s = open_store()
    s.append(EventBatch([ev("acct-1", 1), ev("acct-10", 1), ev("acct-10", 2)]))
    assert [(e.aggregate_id, e.version) for e in s.read_events("acct-1")] == [("acct-1", 1)]


def test_versions_beyond_255_keep_their_order(open_store):
    s = open_store()
    s.append(EventBatch([ev("a", v) for v in range(1, 600)]))
    assert [e.version for e in s.read_events("a", 250)] == list(range(250, 600))


def test_a_stored_version_is_a_conflict_naming_aggregate_and_version_and_nothing_is_written(open_store):
    s = open_store()
    s.append(EventBatch([ev("a", 1, "c1")], [cmd("c1", "a", 1, 1)]))
    batch = EventBatch([ev("b", 1, "c2"), ev("a", 2, "c3"), ev("a", 1, "c3")],
                       [cmd("c2", "b", 1, 1), cmd("c3", "a", 1, 2)], [Snapshot("b", 1, b"s")])
    with pytest.raises(VersionConflictError, match="'a'.*version 1") as info:
        s.append(batch)
    assert (info.value.aggregate_id, info.value.version) == ("a", 1)
    assert s.read_events("b") == [] and [e.version for e in s.read_events("a")] == [1]
    assert s.command_results(["c2", "c3"]) == {} and s.load_snapshot("b") is None


def test_the_same_version_twice_in_one_batch_is_a_conflict(open_store):
    s = open_store()
    with pytest.raises(VersionConflictError):
        s.append(EventBatch([ev("a", 1, "x"), ev("a", 1, "y")]))
    assert s.read_events("a") == []


def test_the_same_command_id_twice_in_one_batch_is_a_duplicate_and_nothing_is_written(open_store):
    s = open_store()
    with pytest.raises(DuplicateCommandError, match="c1"):
        s.append(EventBatch([ev("a", 1, "c1"), ev("b", 1, "c1")], [cmd("c1", "a", 1, 1), cmd("c1", "b", 1, 1)]))
    assert s.read_events("a") == [] and s.read_events("b") == [] and s.command_results(["c1"]) == {}


def test_a_stored_command_id_is_a_duplicate_and_nothing_is_written(open_store):
    s = open_store()
    s.append(EventBatch([], [cmd("c1", "a")]))
    with pytest.raises(DuplicateCommandError, match="c1") as info:
        s.append(EventBatch([ev("a", 1, "c1")], [cmd("c1", "a", 1, 1)]))
    assert info.value.aggregate_id == "a"
    assert s.read_events("a") == []
    assert s.command_results(["c1"])["c1"] == cmd("c1", "a")


def test_command_results_answer_only_the_stored_ids(open_store):
    s = open_store()
    s.append(EventBatch([ev("a", 1, "c1"), ev("a", 2, "c1")], [cmd("c1", "a", 1, 2), cmd("c2", "b")]))
    got = s.command_results(["c1", "c2", "c3"])
    assert got == {"c1": cmd("c1", "a", 1, 2), "c2": cmd("c2", "b")}
    assert s.command_results([]) == {}


def test_the_newest_snapshot_wins_and_an_older_one_never_replaces_it(open_store):
    s = open_store()
    assert s.load_snapshot("a") is None
    s.append(EventBatch(snapshots=[Snapshot("a", 5, b"five")]))
    s.append(EventBatch(snapshots=[Snapshot("a", 3, b"three")]))
    assert s.load_snapshot("a") == Snapshot("a", 5, b"five")
    s.append(EventBatch(snapshots=[Snapshot("a", 9, b"nine")]))
    assert s.load_snapshot("a") == Snapshot("a", 9, b"nine")


def test_iter_events_walks_every_event_by_aggregate_then_version(open_store):
    s = open_store()
    s.append(EventBatch([ev("b", 1), ev("a", 2, "x"), ev("a", 1, "y")]))
    assert [(e.aggregate_id, e.version) for e in s.iter_events()] == [("a", 1), ("a", 2), ("b", 1)]


def test_what_was_appended_survives_close_and_reopen(open_store):
    s = open_store()
    s.append(EventBatch([ev("a", 1, "c1")], [cmd("c1", "a", 1, 1)], [Snapshot("a", 1, b"s")]))
    s.close()
    s = open_store()
    assert s.read_events("a") == [ev("a", 1, "c1")]
    assert s.command_results(["c1"]) == {"c1": cmd("c1", "a", 1, 1)}
    assert s.load_snapshot("a") == Snapshot("a", 1, b"s")


def test_two_stores_on_one_path_in_one_process_share_the_data(open_store):
    first, second = open_store(), open_store()
    first.append(EventBatch([ev("a", 1)]))
    assert [e.version for e in second.read_events("a")] == [1]
    with pytest.raises(VersionConflictError):
        second.append(EventBatch([ev("a", 1, "other")]))
    first.close()
    assert [e.version for e in second.read_events("a")] == [1]


def test_an_id_with_nul_or_empty_is_a_clear_error(open_store):
    s = open_store()
    with pytest.raises(EventStoreError, match="without NUL"):
        s.append(EventBatch([ev("a\x00b", 1)]))
    with pytest.raises(EventStoreError):
        s.command_results([""])


def test_a_closed_store_refuses_use(open_store):
    s = open_store()
    s.close()
    with pytest.raises(EventStoreError, match="closed"):
        s.read_events("a")
