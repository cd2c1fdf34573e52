"""CURVE on the ZeroMQ transport against real broker processes (docs/security.md "CURVE"): a client
with an allowed key sends, pulls and commits; an unknown key, an impostor holding only an allowed
public key, a plaintext client and a client with the wrong server key are each refused at once with
HandshakeRefusedError (not a timeout) and store nothing; the allowed keys reload live; `equeue keys
generate` writes the pair with a 0600 secret."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest

from equeue_core import curve_keys
from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.connection import BrokerConnection
from equeue_core.client.credentials import ClientLink
from equeue_core.client.loop import run_sync
from equeue_core.contracts import TransportSettings
from equeue_core.errors import ConfigError, HandshakeRefusedError
from tests.helpers.broker import BrokerProcess, free_port
from tests.helpers.curve import CurveKeys, make_curve_keys
from tests.helpers.waiting import wait_until


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> CurveKeys:
    return make_curve_keys(tmp_path_factory.mktemp("curve-keys"))


@pytest.fixture
def curve_broker(tmp_path, keys):
    cfg = tmp_path / "broker.toml"
    cfg.write_text("offset_persist_ms = 200\n")
    b = BrokerProcess(tmp_path / "data", transport="zmq", config=str(cfg),
                      extra_args=keys.broker_args()).start()
    yield b
    b.stop()


def good(keys: CurveKeys) -> dict[str, str]:
    return keys.client_credentials()


def stored(b: BrokerProcess, keys: CurveKeys, topic: str) -> int:
    with AdminClient(b.address, **good(keys)) as a:
        return sum(hi for _, hi in a.queue_ranges(topic)) if topic in a.topics() else 0


def test_an_allowed_client_key_sends_pulls_and_commits_over_curve(curve_broker, keys):
    with Producer(curve_broker.address, **good(keys)) as p:
        p.send_batch([Message("curve.work", f"m{i}".encode()) for i in range(10)])
    seen: set[bytes] = set()
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.add(bytes(m.body))

    c = Consumer("g-curve", curve_broker.address, consume_from="first", heartbeat_interval=0.5,
                 rebalance_interval=1.0, commit_interval=0.3, **good(keys)).subscribe("curve.work")
    c.start(handler)
    try:
        assert wait_until(lambda: len(seen) == 10, 60), seen
    finally:
        c.close()
    assert seen == {f"m{i}".encode() for i in range(10)}
    with AdminClient(curve_broker.address, **good(keys)) as a:
        rows = a.groups("g-curve")["g-curve"]["queues"]
        assert sum(r["committed"] or 0 for r in rows if r["topic"] == "curve.work") == 10


def test_the_curve_keys_come_from_the_environment_when_not_passed(curve_broker, keys, monkeypatch):
    monkeypatch.setenv("EQUEUE_CURVE_SERVER_KEY", curve_keys.read_key_file(keys.server[0])[0])  # Z85 text
    monkeypatch.setenv("EQUEUE_CURVE_SECRET_KEY", str(keys.client[1]))
    with Producer(curve_broker.address) as p:
        p.send_batch([Message("curve.env", b"x")])
    assert stored(curve_broker, keys, "curve.env") == 1


@pytest.mark.parametrize("case", ["unknown client key", "plaintext client", "wrong server key"])
def test_a_refused_client_gets_handshake_refused_at_once_and_stores_nothing(curve_broker, keys, case):
    credentials = {
        "unknown client key": {"curve_server_key": str(keys.server[0]), "curve_secret_key": str(keys.other[1])},
        "plaintext client": {},
        "wrong server key": {"curve_server_key": str(keys.other[0]), "curve_secret_key": str(keys.client[1])},
    }[case]
    expected = {"unknown client key": "not among the server's allowed keys",
                "plaintext client": "requires CURVE",
                "wrong server key": "wrong curve_server_key"}[case]
    # send_timeout far above the test's own limit: only the handshake refusal can end this in time
    with pytest.raises(HandshakeRefusedError, match=expected):
        with Producer(curve_broker.address, send_timeout=600, retries=0, **credentials) as p:
            p.send_batch([Message("curve.refused", b"sneaky")])
    assert stored(curve_broker, keys, "curve.refused") == 0
    # A plaintext client sees the mismatch in the greeting too and may hang up before the broker's
    # monitor reports it: the broker then logs that the peer closed during the handshake.
    logged = {"unknown client key": ["not allowed, handshake refused"],
              "plaintext client": ["mechanism mismatch", "the peer closed during the handshake"],
              "wrong server key": ["cryptographic failure"]}[case]
    assert wait_until(lambda: any(w in curve_broker.log_path.read_text() for w in logged), 10), \
        curve_broker.log_path.read_text()


def test_an_impostor_with_an_allowed_public_key_but_another_secret_is_refused(curve_broker, keys):
    allowed_public = curve_keys.read_key_file(keys.client[0])[0]
    _, other_secret = curve_keys.key_pair(str(keys.other[1]))
    forged = TransportSettings(connect_timeout=600, curve_server_key=curve_keys.read_key_file(keys.server[0])[0],
                               curve_public_key=allowed_public, curve_secret_key=other_secret)
    with pytest.raises(HandshakeRefusedError):
        run_sync(BrokerConnection(curve_broker.address, link=ClientLink(forged, None)).connect())
    assert stored(curve_broker, keys, "curve.refused") == 0


def test_a_client_given_a_public_key_that_is_not_its_secrets_own_fails_before_connecting(keys):
    with pytest.raises(ConfigError, match="does not belong"):
        with Producer("zmq://127.0.0.1:1", curve_server_key=str(keys.server[0]),
                      curve_secret_key=str(keys.client[1]), curve_public_key=str(keys.other[0])) as p:
            p.send_batch([Message("curve.never", b"x")])


def test_a_key_added_to_the_allowed_directory_is_let_in_without_a_restart(curve_broker, keys, tmp_path):
    newcomer = curve_keys.generate(tmp_path / "newcomer", "newcomer")
    creds = {"curve_server_key": str(keys.server[0]), "curve_secret_key": str(newcomer[1])}
    with pytest.raises(HandshakeRefusedError):
        with Producer(curve_broker.address, retries=0, **creds):
            pass
    shutil.copy(newcomer[0], keys.allowed / "newcomer.key")
    try:
        def admitted() -> bool:
            try:
                with Producer(curve_broker.address, retries=0, **creds) as p:
                    p.send_batch([Message("curve.newcomer", b"in")])
                return True
            except HandshakeRefusedError:
                return False

        assert wait_until(admitted, 30)
    finally:
        os.remove(keys.allowed / "newcomer.key")
    assert stored(curve_broker, keys, "curve.newcomer") == 1


def test_a_curve_broker_without_allowed_keys_encrypts_for_any_client_key_but_refuses_plaintext(tmp_path, keys):
    b = BrokerProcess(tmp_path / "data", transport="zmq", extra_args=keys.broker_args(allowed=False)).start()
    try:
        with Producer(b.address, curve_server_key=str(keys.server[0])) as p:  # a throw-away client pair
            p.send_batch([Message("curve.open", b"x")])
        with pytest.raises(HandshakeRefusedError, match="requires CURVE"):
            with Producer(b.address, retries=0):
                pass
        assert stored(b, keys, "curve.open") == 1
    finally:
        b.stop()


def test_a_connected_client_whose_broker_returns_with_another_key_gets_handshake_refused_not_a_timeout(
        tmp_path, keys):
    port = free_port()
    first = BrokerProcess(tmp_path / "data", transport="zmq", port=port,
                          extra_args=keys.broker_args(allowed=False)).start()
    with Producer(first.address, send_timeout=600, retries=0, **good(keys)) as p:
        try:
            p.send_batch([Message("curve.rekeyed", b"before")])
        finally:
            first.stop()
        second = BrokerProcess(tmp_path / "data", transport="zmq", port=port,
                               extra_args=["--curve-secret-key", str(keys.other[1])]).start()
        try:
            with pytest.raises(HandshakeRefusedError, match="wrong curve_server_key"):
                p.send_batch([Message("curve.rekeyed", b"after")])
        finally:
            second.stop()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQUEUE_CURVE_")}
    return subprocess.run([sys.executable, "-m", "equeue_core.cli.main", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_keys_generate_writes_a_pair_with_a_private_secret_and_never_overwrites(tmp_path):
    out = tmp_path / "keys"
    made = _cli("keys", "generate", "--out", str(out), "--name", "b1")
    assert made.returncode == 0, made.stderr
    public, secret = curve_keys.read_key_file(out / "b1.key_secret")
    assert curve_keys.read_key_file(out / "b1.key") == (public, None)
    assert public in made.stdout and secret not in made.stdout
    assert stat.S_IMODE(os.stat(out / "b1.key_secret").st_mode) == 0o600
    again = _cli("keys", "generate", "--out", str(out), "--name", "b1")
    assert again.returncode == 1 and "exists already" in again.stderr and "Traceback" not in again.stderr
    assert curve_keys.read_key_file(out / "b1.key_secret") == (public, secret)


def test_cli_client_commands_take_curve_flags_and_fail_in_one_line_without_them(curve_broker, keys):
    ok = _cli("topics", "create", "curve.cli", "--queues", "2", "--broker", curve_broker.address,
              "--curve-server-key", str(keys.server[0]), "--curve-secret-key", str(keys.client[1]))
    assert ok.returncode == 0, ok.stderr
    plain = _cli("topics", "list", "--broker", curve_broker.address)
    assert plain.returncode == 1 and "requires CURVE" in plain.stderr and "Traceback" not in plain.stderr, plain.stderr
