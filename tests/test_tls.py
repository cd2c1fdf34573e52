"""TLS on the TCP transport against real broker processes (docs/security.md "TLS"): the right CA
works end to end; a plaintext client, a client trusting another CA, a client without the required
certificate, and garbage before the handshake are all refused clearly while the broker goes on
serving."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading

import pytest

from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.errors import EQueueError, TlsRequiredError, TransportError
from tests.helpers.broker import BrokerProcess
from tests.helpers.certs import Certs, make_certs
from tests.helpers.waiting import wait_until
from tests.test_transport_hostile import _attack, attack_payloads


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _broker(tmp_path, certs: Certs, mutual: bool = False) -> BrokerProcess:
    args = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    if mutual:
        args += ["--tls-ca", str(certs.ca)]
    return BrokerProcess(tmp_path / "data", extra_args=args).start()


@pytest.fixture
def tls_broker(tmp_path, certs):
    b = _broker(tmp_path, certs)
    yield b
    b.stop()


@pytest.fixture
def mtls_broker(tmp_path, certs):
    b = _broker(tmp_path, certs, mutual=True)
    yield b
    b.stop()


def tls_address(b: BrokerProcess) -> str:
    return f"tls://127.0.0.1:{b.port}"


def produce_and_consume(address: str, topic: str, **tls: str) -> None:
    with Producer(address, **tls) as p:
        p.send_batch([Message(topic, f"m{i}".encode()) for i in range(10)])
    seen: set[bytes] = set()
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.add(bytes(m.body))

    c = Consumer("g-tls", address, consume_from="first", heartbeat_interval=0.5, rebalance_interval=1.0,
                 commit_interval=0.5, **tls).subscribe(topic)
    c.start(handler)
    try:
        assert wait_until(lambda: len(seen) == 10, 60), seen
    finally:
        c.close()
    with AdminClient(address, **tls) as a:
        assert sum(hi for _, hi in a.queue_ranges(topic)) == 10


def test_a_client_with_the_right_ca_produces_and_consumes_over_tls(tls_broker, certs):
    produce_and_consume(tls_address(tls_broker), "tls.work", tls_ca=str(certs.ca))


def test_the_tls_ca_comes_from_the_environment_when_not_passed(tls_broker, certs, monkeypatch):
    monkeypatch.setenv("EQUEUE_TLS_CA", str(certs.ca))
    with Producer(tls_address(tls_broker)) as p:
        p.send_batch([Message("tls.env", b"x")])


def test_a_plaintext_client_on_a_tls_port_gets_tls_required_not_a_timeout(tls_broker, certs):
    with pytest.raises(TlsRequiredError, match="TLS only"):
        with Producer(f"tcp://127.0.0.1:{tls_broker.port}", send_timeout=120, retries=0) as p:
            p.send_batch([Message("tls.plain", b"sneaky")])
    with AdminClient(tls_address(tls_broker), tls_ca=str(certs.ca)) as a:
        assert "tls.plain" not in a.topics() or sum(hi for _, hi in a.queue_ranges("tls.plain")) == 0


def test_a_client_trusting_another_ca_fails_certificate_verification(tls_broker, certs):
    with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
        with Producer(tls_address(tls_broker), tls_ca=str(certs.other_ca)) as p:
            p.send_batch([Message("tls.wrongca", b"x")])


def test_a_tls_client_on_a_plaintext_port_fails_clearly(tmp_path, certs):
    b = BrokerProcess(tmp_path / "plain").start()
    try:
        with pytest.raises(TransportError):
            with AdminClient(f"tls://127.0.0.1:{b.port}", tls_ca=str(certs.ca)) as a:
                a.topics()
    finally:
        b.stop()


def test_mutual_tls_refuses_a_client_without_a_certificate_and_serves_one_with(mtls_broker, certs):
    with pytest.raises(EQueueError, match="(?i)certificate"):
        with Producer(tls_address(mtls_broker), tls_ca=str(certs.ca), send_timeout=120, retries=0) as p:
            p.send_batch([Message("tls.mutual", b"no-cert")])
    produce_and_consume(tls_address(mtls_broker), "tls.mutual", tls_ca=str(certs.ca),
                        tls_cert=str(certs.client_cert), tls_key=str(certs.client_key))


def test_garbage_before_the_handshake_never_stops_a_tls_broker(tls_broker, certs):
    rng = random.Random(4321)
    fake_hello = [("fake-client-hello", b"\x16\x03\x01" + rng.randbytes(rng.randrange(1, 3000)))
                  for _ in range(5)]

    async def attack() -> list[str]:
        payloads = [(k, p) for _ in range(3) for k, p in attack_payloads(rng)] + fake_hello
        return await asyncio.gather(*[_attack(tls_broker.port, k, p, False) for k, p in payloads])

    with Producer(tls_address(tls_broker), tls_ca=str(certs.ca)) as p:
        for round_ in range(3):
            results = asyncio.run(attack())
            assert len(results) == 41
            p.send_batch([Message("tls.hostile", f"r{round_}".encode())])
    assert tls_broker.proc is not None and tls_broker.proc.poll() is None
    with AdminClient(tls_address(tls_broker), tls_ca=str(certs.ca)) as a:
        assert sum(hi for _, hi in a.queue_ranges("tls.hostile")) == 3


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQUEUE_TLS_")}
    return subprocess.run([sys.executable, "-m", "equeue_core.cli.main", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_cli_client_commands_take_tls_flags_and_fail_in_one_line_without_them(tls_broker, certs):
    address = tls_address(tls_broker)
    ok = _cli("topics", "create", "tls.cli", "--queues", "2", "--broker", address, "--tls-ca", str(certs.ca))
    assert ok.returncode == 0, ok.stderr
    listed = _cli("topics", "list", "--broker", address, "--tls-ca", str(certs.ca))
    assert listed.returncode == 0 and "tls.cli" in listed.stdout, listed.stderr
    plain = _cli("topics", "list", "--broker", f"tcp://127.0.0.1:{tls_broker.port}")
    assert plain.returncode != 0 and "TLS only" in plain.stderr and "Traceback" not in plain.stderr, plain.stderr
