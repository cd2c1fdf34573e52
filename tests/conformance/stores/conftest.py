"""Parametrizes every test that takes `store_name` over all installed store engines."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from equeue_core.contracts import StoreReader
from equeue_core.plugins import get_plugin_manager

from .kit import Opened, open_store, store_names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_name" in metafunc.fixturenames:
        metafunc.parametrize("store_name", store_names())


class Harness:
    """Opens store engines and readers on one data dir and closes whatever is left open."""

    def __init__(self, name: str, data_dir: str) -> None:
        self.name = name
        self.data_dir = data_dir
        self._open: list = []

    def open(self, flush: str = "async", **options: object) -> Opened:
        opened = open_store(self.name, self.data_dir, flush=flush, **options)
        self._open.append(opened)
        return opened

    def reader(self) -> StoreReader:
        reader = get_plugin_manager().store_reader(self.name)(self.data_dir, {})
        self._open.append(reader)
        return reader

    def close_all(self) -> None:
        for obj in reversed(self._open):
            if isinstance(obj, Opened):
                obj.close()
            else:
                try:
                    obj.close()
                except Exception:  # a second close of an already closed object is not under test here
                    pass
        self._open.clear()


@pytest.fixture
def harness(store_name: str, tmp_path: os.PathLike) -> Iterator[Harness]:
    h = Harness(store_name, os.path.join(str(tmp_path), "data"))
    os.makedirs(h.data_dir, exist_ok=True)
    yield h
    h.close_all()
