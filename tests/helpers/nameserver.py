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

from tests.helpers.broker import BrokerProcess

T = TypeVar("T")


class NameServerProcess(BrokerProcess):
    def __init__(self, log_dir: Path, port: int | None = None, transport: str = "tcp",
                 expiry_s: float | None = None, env: dict[str, str] | None = None,
                 metrics_port: int = 0, extra_args: Sequence[str] = ()) -> None:
        env = dict(env or {})
        if expiry_s is not None:
            env["EQUEUE_BROKER_EXPIRY_S"] = str(expiry_s)
        super().__init__(Path(log_dir) / "nameserver", transport=transport, port=port, env=env,
                         extra_args=extra_args)  # e.g. ["--curve-secret-key", "ns.key_secret"]
        self.log_path = Path(log_dir) / f"nameserver-{self.port}.log"
        self.metrics_port = metrics_port  # 0: many name servers run at once in the tests

    def command(self) -> list[str]:
        return [sys.executable, "-m", "equeue_core.cli.main", "nameserver", "--host", "127.0.0.1",
                "--port", str(self.port), "--transport", self.transport, "--metrics-port", str(self.metrics_port),
                *self.extra_args]


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
