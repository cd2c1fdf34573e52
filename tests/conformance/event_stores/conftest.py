"""Parametrizes every test that takes `event_store` over all installed event store plugins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from equeue_cqrs.store import EventStore, event_store_names, open_event_store


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "event_store_name" in metafunc.fixturenames:
        metafunc.parametrize("event_store_name", event_store_names())


class Opener:
    """Opens event stores on one path and closes whatever is left open."""

    def __init__(self, name: str, path: str) -> None:
        self.name, self.path, self.opened = name, path, []

    def __call__(self) -> EventStore:
        store = open_event_store(self.name, self.path, {"sync": "false"})
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for s in reversed(self.opened):
            s.close()


@pytest.fixture
def open_store(event_store_name: str, tmp_path) -> Iterator[Opener]:
    opener = Opener(event_store_name, str(tmp_path / "events"))
    yield opener
    opener.close_all()
