"""Fixtures for the CQRS tests: event stores of every plugin in tmp dirs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from equeue_cqrs.store import EventStore, event_store_names, open_event_store


@pytest.fixture(params=event_store_names())
def event_store(request, tmp_path) -> Iterator[EventStore]:
    store = open_event_store(request.param, str(tmp_path / "events"), {"sync": "false"})
    yield store
    store.close()


def numbers_of(store: EventStore, aggregate_id: str) -> list[int]:
    """The numbers appended to a NumberLog, from its stored events, checking versions are 1..n."""
    from equeue_cqrs.messages import decode

    events = store.read_events(aggregate_id)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    return [decode(e.type, e.payload).n for e in events if e.type == "NumberAppended"]
