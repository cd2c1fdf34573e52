"""A broker group of real broker processes for the replication tests: a master and replicas on
127.0.0.1, started through tests/helpers/broker.py, with waits on their replication status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from equeue_core.client.admin import AdminClient
from equeue_core.codes import Code
from tests.helpers.broker import BrokerProcess
from tests.helpers.waiting import wait_until

GROUP = ["--cluster", "c1", "--name", "broker-a"]


def master(tmp: Path, name: str = "m", broker_id: int = 0, replication: str = "async", store: str = "file",
           flush: str = "async", min_insync: int = 1, extra: tuple[str, ...] = (),
           transport: str = "tcp") -> BrokerProcess:
    return BrokerProcess(tmp / name, store=store, flush=flush, transport=transport, extra_args=[
        *GROUP, "--broker-id", str(broker_id), "--replication", replication, "--min-insync", str(min_insync),
        *extra])


def replica(tmp: Path, of: BrokerProcess | str, name: str = "r", broker_id: int = 1, store: str = "file",
            replication: str = "async", group: list[str] | None = None, port: int | None = None,
            transport: str = "tcp", env: dict[str, str] | None = None) -> BrokerProcess:
    address = of if isinstance(of, str) else f"127.0.0.1:{of.port}"
    return BrokerProcess(tmp / name, store=store, port=port, transport=transport, env=env, extra_args=[
        *(group or GROUP), "--broker-id", str(broker_id), "--role", "replica", "--master", address,
        "--replication", replication])


def status(b: BrokerProcess) -> dict[str, Any]:
    with AdminClient(b.address) as admin:
        return admin.request(Code.REPL_STATUS, {})


def request(b: BrokerProcess, code: int, header: dict | None = None) -> dict[str, Any]:
    with AdminClient(b.address) as admin:
        return admin.request(code, header or {})


def wait_in_sync(m: BrokerProcess, broker_id: int = 1, timeout: float = 30) -> None:
    assert wait_until(lambda: broker_id in status(m)["in_sync"], timeout, 0.1), status(m)


def wait_caught_up(m: BrokerProcess, r: BrokerProcess, timeout: float = 60) -> int:
    end = status(m)["log_end"]
    assert wait_until(lambda: status(r)["log_end"] >= end, timeout, 0.1), (status(m), status(r))
    return end


def log_text(b: BrokerProcess) -> str:
    return b.log_path.read_text(errors="replace")
