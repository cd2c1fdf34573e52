"""Run a real name server process for a test: `with NameServerProcess(tmp_path) as ns: ...`.

It is a BrokerProcess with another command (`equeue nameserver`): same start (wait for the
"listening" line), stop (SIGTERM), kill (SIGKILL) and reaping. A name server keeps nothing on
disk; `log_dir` only holds its stderr log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from tests.helpers.broker import BrokerProcess, free_port

T = TypeVar("T")


class NameServerProcess(BrokerProcess):
    def __init__(self, log_dir: Path, port: int | None = None, transport: str = "tcp",
                 expiry_s: float | None = None, env: dict[str, str] | None = None,
                 metrics_port: int = 0, controller_port: int | None = None, controller_peers: str = "",
                 extra_args: Sequence[str] = ()) -> None:
        env = dict(env or {})
        if expiry_s is not None:
            env["EQUEUE_BROKER_EXPIRY_S"] = str(expiry_s)
        super().__init__(Path(log_dir) / "nameserver", transport=transport, port=port, env=env,
                         extra_args=extra_args)  # e.g. ["--curve-secret-key", "ns.key_secret"]
        self.log_path = Path(log_dir) / f"nameserver-{self.port}.log"
        self.metrics_port = metrics_port  # 0: many name servers run at once in the tests
        self.controller_port = controller_port  # with controller_peers: this name server's Raft port
        self.controller_peers = controller_peers

    def command(self) -> list[str]:
        return [sys.executable, "-m", "equeue_core.cli.main", "nameserver", "--host", "127.0.0.1",
                "--port", str(self.port), "--transport", self.transport, "--metrics-port", str(self.metrics_port),
                *self.extra_args,
                *(["--controller-peers", self.controller_peers, "--controller-port", str(self.controller_port)]
                  if self.controller_peers else [])]


def controller_nameservers(log_dir: Path, count: int = 3, **kwargs) -> list[NameServerProcess]:
    """`count` name servers (not started) that run the controller together, each with a free Raft port."""
    raft_ports = [free_port() for _ in range(count)]
    peers = ",".join(f"127.0.0.1:{p}" for p in raft_ports)
    return [NameServerProcess(log_dir, controller_port=p, controller_peers=peers, **kwargs) for p in raft_ports]


def cluster_args(nameservers: list[NameServerProcess], name: str, cluster: str = "c1") -> list[str]:
    """The broker flags that join it to a cluster served by these name servers."""
    return ["--nameserver", ",".join(ns.address for ns in nameservers), "--name", name, "--cluster", cluster]


def wait_for(probe: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.1,
             what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy, at most `timeout` seconds (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")
