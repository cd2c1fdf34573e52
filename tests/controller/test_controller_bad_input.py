"""Bad controller settings and requests: each a one-line error, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from equeue_core.client.nameserver import NameServerClient
from equeue_core.errors import NoControllerError
from tests.helpers.broker import free_port
from tests.helpers.nameserver import NameServerProcess


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "equeue_core.cli.main", *args], capture_output=True, text=True,
                          timeout=60)


def last_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("peers", "port", "message"), [
    ("127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "7009",
     "must list this name server's own Raft address 127.0.0.1:7009"),
    ("127.0.0.1:7001,127.0.0.1:7002", "7001", "a controller needs at least 3 peers"),
    ("127.0.0.1:7001,nonsense,127.0.0.1:7003", "7001", "controller peer 'nonsense' must be host:port"),
])
def test_a_bad_controller_peer_list_stops_the_name_server_with_one_line(peers, port, message):
    line = last_line(run("nameserver", "--host", "127.0.0.1", "--port", str(free_port()), "--metrics-port", "0",
                         "--controller-peers", peers, "--controller-port", port))
    assert line.startswith("equeue: ") and message in line


def test_a_controller_broker_without_name_servers_is_a_one_line_error(tmp_path):
    line = last_line(run("broker", "--data-dir", str(tmp_path / "b"), "--port", str(free_port()), "--controller"))
    assert line == ("equeue: config controller = true (--controller) needs nameserver (--nameserver): "
                    "the controller runs in the name servers")


def test_controller_requests_to_a_name_server_without_controller_are_refused_clearly(tmp_path):
    with NameServerProcess(tmp_path) as ns, NameServerClient(ns.address) as client:
        with pytest.raises(NoControllerError, match="runs no controller"):
            client.controller_info()
        with pytest.raises(NoControllerError):
            client.elect_master("c1", "broker-a", 1)
        failover = run("cluster", "failover", "--nameserver", ns.address, "--group", "broker-a", "--to", "1",
                       "--cluster", "c1")
        assert last_line(failover).startswith("equeue: name server 127.0.0.1:") and "runs no controller" in \
            last_line(failover)
