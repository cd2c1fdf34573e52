"""Shared fixtures: real broker processes on 127.0.0.1, one per test, in tmp dirs."""

from __future__ import annotations

import pytest

from equeue_core.plugins import get_plugin_manager
from tests.helpers.broker import BrokerProcess


def installed(hook: str) -> list[str]:
    return get_plugin_manager().names(hook)


def stack_params() -> list:
    """(store, transport) pairs the end-to-end tests run on: every store over tcp, and file over
    every other transport, so each plugin meets the whole broker without a full cross product."""
    stores = installed("equeue_store_engines")
    transports = installed("equeue_transports")
    pairs = [(s, "tcp") for s in stores] + [("file", t) for t in transports if t != "tcp"]
    return [pytest.param(p, id=f"{p[0]}-{p[1]}") for p in pairs]


@pytest.fixture(params=stack_params())
def stack(request) -> tuple[str, str]:
    return request.param


@pytest.fixture(autouse=True)
def tls_client_ca(request, monkeypatch):
    """A test run on the `tls` transport (a `stack` or `transport` parameter) gets EQUEUE_TLS_CA
    set to the session CA, so its clients (and CLI subprocesses) trust the brokers that
    BrokerProcess starts with the session certificates; other tests see no TLS settings."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    stack = params.get("stack") or ()
    if params.get("transport") == "tls" or "tls" in stack:
        from tests.helpers.certs import session_certs

        monkeypatch.setenv("EQUEUE_TLS_CA", str(session_certs().ca))


@pytest.fixture
def broker(tmp_path, stack):
    store, transport = stack
    b = BrokerProcess(tmp_path / "data", store=store, transport=transport).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def file_broker(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        yield b
    finally:
        b.stop()
