"""Shared fixtures: real broker processes on 127.0.0.1, one per test, in tmp dirs."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from equeue_core.plugins import get_plugin_manager
from tests.helpers.broker import ZMQ_CURVE, BrokerProcess

# The suite's brokers write real commit logs under the temp dir (a full run held under 100 MB
# there at once, 2026-11-27; Spark's scratch goes there too). With the disk nearly full, tests
# would fail one by one on ENOSPC far from the cause (a CI run did, after 398 s): refuse at once.
MIN_FREE_MB = 1024


def min_free_mb() -> int:
    raw = os.environ.get("EQUEUE_TEST_MIN_FREE_MB", "").strip()
    return int(raw) if raw.isdigit() else MIN_FREE_MB


def pytest_sessionstart(session: pytest.Session) -> None:
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free // (1024 * 1024)
    if free < min_free_mb():
        pytest.exit(f"the test suite needs {min_free_mb()} MiB free in {tmp} (its brokers write real files "
                    f"there) and there are {free} MiB: free some space or set TMPDIR to a roomier disk "
                    "(EQUEUE_TEST_MIN_FREE_MB=0 skips this check)", returncode=2)


def installed(hook: str) -> list[str]:
    return get_plugin_manager().names(hook)


def stack_params() -> list:
    """(store, transport) pairs the end-to-end tests run on: every store over tcp, and file over
    every other transport, so each plugin meets the whole broker without a full cross product."""
    stores = installed("equeue_store_engines")
    transports = installed("equeue_transports")
    pairs = [(s, "tcp") for s in stores] + [("file", t) for t in transports if t != "tcp"]
    if "zmq" in transports:
        pairs.append(("file", ZMQ_CURVE))  # zmq serving CURVE (BrokerProcess, curve_client_keys)
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


@pytest.fixture(autouse=True)
def curve_client_keys(request, monkeypatch):
    """A test run on the `zmq+curve` stack gets EQUEUE_CURVE_SERVER_KEY/_SECRET_KEY set to the
    session keys, so its clients pass the CURVE brokers that BrokerProcess starts; other tests see
    no CURVE settings."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if ZMQ_CURVE in (params.get("stack") or ()) or params.get("transport") == ZMQ_CURVE:
        from tests.helpers.curve import session_curve_keys

        for name, value in session_curve_keys().client_credentials().items():
            monkeypatch.setenv("EQUEUE_" + name.upper(), value)


@pytest.fixture
def broker(tmp_path, stack):
    store, transport = stack
    with BrokerProcess(tmp_path / "data", store=store, transport=transport) as b:
        yield b


@pytest.fixture
def file_broker(tmp_path):
    with BrokerProcess(tmp_path / "data") as b:
        yield b
