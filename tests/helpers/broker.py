"""Run a real broker process for a test: `with start_broker(tmp_path) as b: Producer(b.address)`.

The broker runs as `python -m equeue_core.cli.main broker` on 127.0.0.1 with a free port; the
helper waits for its "listening" line, and stop()/kill() always reap the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.ports import free_port

ZMQ_CURVE = "zmq+curve"  # a `transport` meaning zmq serving CURVE with the session keys (tests/helpers/curve.py)


class BrokerProcess:
    def __init__(self, data_dir: Path, store: str = "file", transport: str = "tcp", flush: str = "async",
                 port: int | None = None, env: dict[str, str] | None = None, config: str | None = None,
                 metrics_port: int | None = 0, extra_args: Sequence[str] = (),
                 prefix: list[str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.store = store
        self.transport = transport
        self.flush = flush
        self.port = port or free_port()
        # Test brokers must not depend on how full the host's disk is: the high-water cleaner is
        # off unless a test asks for it (tests/test_retention.py does).
        self.env = {"EQUEUE_DISK_HIGH_WATER": "1.0", **(env or {})}
        self.config = config
        # Many test brokers run at once: the Prometheus endpoint is off (0) unless a test gives a
        # port (None leaves it to the config file / environment).
        self.metrics_port = metrics_port
        self.extra_args = list(extra_args)  # e.g. ["--nameserver", "127.0.0.1:9876", "--name", "broker-a"]
        self.prefix = list(prefix or [])  # a command the broker runs under (e.g. strace)
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"broker-{self.data_dir.name}-{self.port}.log"

    @property
    def address(self) -> str:
        return f"{'zmq' if self.transport == ZMQ_CURVE else self.transport}://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [*self.prefix, sys.executable, "-m", "equeue_core.cli.main", "broker", "--data-dir", str(self.data_dir),
               "--host", "127.0.0.1", "--port", str(self.port), "--store", self.store,
               "--transport", "zmq" if self.transport == ZMQ_CURVE else self.transport, "--flush", self.flush]
        if self.config:
            cmd += ["--config", self.config]
        if self.metrics_port is not None:
            cmd += ["--metrics-port", str(self.metrics_port)]
        if self.transport == "tls" and "--tls-cert" not in self.extra_args:
            # the tls transport needs a certificate: the session's (clients find its CA through
            # the tls_client_ca fixture in tests/conftest.py)
            from tests.helpers.certs import session_certs

            certs = session_certs()
            cmd += ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
        if self.transport == ZMQ_CURVE and "--curve-secret-key" not in self.extra_args:
            # CURVE with the session keys (clients find theirs through the curve_client_keys
            # fixture in tests/conftest.py)
            from tests.helpers.curve import session_curve_keys

            cmd += session_curve_keys().broker_args()
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        env = dict(os.environ, **self.env)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=self._log, env=env)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if b"listening on" in line:
                return self
        self.kill()
        raise RuntimeError(f"broker did not start; log: {self.log_path.read_text()[-3000:]}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the broker flushes and persists offsets on the way out. Under a
        `prefix` (strace) the broker itself gets the signal (its pid from broker.json), so the
        wrapper ends with it instead of dying first and leaving the broker behind."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            if self.prefix:
                self._signal_broker_itself(signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self._reap()

    def _signal_broker_itself(self, sig: int) -> None:
        try:
            pid = json.loads((self.data_dir / "broker.json").read_text())["pid"]
            os.kill(pid, sig)
        except (OSError, ValueError, KeyError):
            self.proc.send_signal(sig)  # no broker.json (it never started): the wrapper

    def kill(self) -> int:
        """SIGKILL: a crash, nothing flushed on the way out."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return self._reap()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The broker process stopped (SIGSTOP) for the block: it reads and answers nothing, and
        what clients send meanwhile waits in its socket; SIGCONT on the way out."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def _reap(self) -> int:
        assert self.proc is not None
        rc = self.proc.returncode
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        self.proc = None
        return rc

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

    def __enter__(self) -> BrokerProcess:
        return self if self.proc else self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill() if exc[0] is not None else self.stop()


def live_stats_in_process(data_dir: Path) -> dict:
    """The live BROKER_STATS figures of a Broker started inside this process, not by the broker
    command: what a program that embeds a Broker gets (no process-wide settings of its own)."""
    import asyncio

    from equeue_core.broker.broker import Broker
    from equeue_core.config import load

    async def run() -> dict:
        broker = Broker(load(overrides={"data_dir": str(data_dir), "port": free_port()}))
        await broker.start()
        try:
            return broker.metrics.live()
        finally:
            await broker.stop()

    return asyncio.run(run())


def start_broker(tmp_path: Path, name: str = "data", **kwargs) -> BrokerProcess:
    """A started broker whose data dir is tmp_path/name; use it as a context manager."""
    return BrokerProcess(Path(tmp_path) / name, **kwargs).start()


def create_topic(broker: BrokerProcess, name: str, queues: int) -> str:
    """Create `name` with `queues` queues on the broker (AdminClient); returns the name."""
    from equeue_core.client import AdminClient

    with AdminClient(broker.address) as admin:
        admin.create_topic(name, queues)
    return name
