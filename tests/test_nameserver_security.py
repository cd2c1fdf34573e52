"""Name-server traffic under the same credentials as broker traffic (docs/security.md, "Name servers"):
a name server serving TLS with ACLs on, and a broker registering over TLS as an admin account, route
and register; without credentials, with a wrong secret, as a non-admin broker or in plaintext they
are refused with the usual errors. The same over ZeroMQ with CURVE. Real processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest

from equeue_core import curve_keys
from equeue_core.client import AdminClient, Consumer, Message, Producer
from equeue_core.client.nameserver import NameServerClient
from equeue_core.errors import AccessDeniedError, HandshakeRefusedError, TlsRequiredError, TopicNotFoundError
from tests.helpers.accounts import ACL, APP, ROOT
from tests.helpers.broker import BrokerProcess
from tests.helpers.certs import Certs, make_certs
from tests.helpers.nameserver import NameServerProcess, cluster_args, wait_for
from tests.helpers.waiting import wait_until


class SecureCluster:
    def __init__(self, d: Path, certs: Certs) -> None:
        self.d = d
        self.certs = certs
        self.acl = d / "acl.toml"
        self.acl.write_text(ACL)
        self.ns = NameServerProcess(d, transport="tls", env={
            "EQUEUE_TLS_SERVER_CERT": str(certs.server_cert), "EQUEUE_TLS_SERVER_KEY": str(certs.server_key),
            "EQUEUE_ACL": "true", "EQUEUE_ACL_FILE": str(self.acl)})

    def broker(self, name: str, account: tuple[str, str] | None) -> BrokerProcess:
        env = {"EQUEUE_LINK_TLS_CA": str(self.certs.ca)}
        if account is not None:
            env.update(EQUEUE_LINK_ACCESS_KEY=account[0], EQUEUE_LINK_SECRET_KEY=account[1])
        return BrokerProcess(self.d / name, transport="tls", env=env, extra_args=[
            "--tls-cert", str(self.certs.server_cert), "--tls-key", str(self.certs.server_key),
            "--acl-file", str(self.acl), *cluster_args([self.ns], name)])

    def client(self, account: tuple[str, str] | None = APP) -> dict[str, str]:
        creds = {"tls_ca": str(self.certs.ca)}
        if account is not None:
            creds.update(access_key=account[0], secret_key=account[1])
        return creds

    def brokers(self) -> list[str]:
        with NameServerClient(self.ns.address, **self.client()) as ns:
            return sorted(b.name for b in ns.cluster_info().brokers)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("secure-cluster")
    c = SecureCluster(d, make_certs(d / "certs"))
    c.ns.start()
    good = c.broker("broker-a", ROOT)
    try:
        good.start()
        try:
            wait_for(lambda: c.brokers() == ["broker-a"], what="broker-a registered")
            yield c
        finally:
            good.stop()
    finally:
        c.ns.stop()


def test_a_tls_acl_cluster_registers_routes_and_carries_messages_with_credentials(cluster):
    creds = cluster.client()
    with AdminClient(nameserver=cluster.ns.address, **cluster.client(ROOT)) as admin:
        assert admin.create_topic("secure.orders", 2) == {"broker-a": 2}
    with Producer(nameserver=cluster.ns.address, **creds) as p:
        p.send_batch([Message("secure.orders", f"m{i}".encode()) for i in range(6)])
    with NameServerClient(cluster.ns.address, **creds) as ns:
        assert wait_until(lambda: "broker-a" in {b.name for b in _route(ns, "secure.orders")}, 30)
    seen: set[bytes] = set()
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.add(bytes(m.body))

    c = Consumer("g-secure", nameserver=cluster.ns.address, consume_from="first", heartbeat_interval=0.5,
                 rebalance_interval=1.0, commit_interval=0.5, **creds).subscribe("secure.orders")
    c.start(handler)
    try:
        assert wait_until(lambda: len(seen) == 6, 60), seen
    finally:
        c.close()


def _route(ns: NameServerClient, topic: str) -> list:
    try:
        return list(ns.get_route(topic).brokers)
    except TopicNotFoundError:
        return []


@pytest.mark.parametrize("case", ["unsigned", "wrong secret"])
def test_a_client_without_valid_credentials_gets_no_route_from_the_name_server(cluster, case):
    account = None if case == "unsigned" else (APP[0], "not-the-secret-0001")
    reason = "not signed" if case == "unsigned" else "bad signature"
    with NameServerClient(cluster.ns.address, **cluster.client(account)) as ns:
        with pytest.raises(AccessDeniedError, match=reason):
            ns.get_route("secure.orders")
        with pytest.raises(AccessDeniedError):
            ns.cluster_info()


def test_a_plaintext_client_of_the_tls_name_server_gets_tls_required(cluster):
    plain = cluster.ns.address.replace("tls://", "tcp://")
    with NameServerClient(plain, access_key=APP[0], secret_key=APP[1]) as ns:
        with pytest.raises(TlsRequiredError):
            ns.get_route("secure.orders")


@pytest.mark.parametrize("account", [None, APP], ids=["no-credentials", "not-admin"])
def test_a_broker_without_an_admin_account_is_not_registered(cluster, account):
    name = "intruder-" + ("none" if account is None else account[0])
    b = cluster.broker(name, account).start()  # a refused registration does not stop a broker
    try:
        assert cluster.brokers() == ["broker-a"]
        expected = "not signed" if account is None else "is not an admin"
        assert wait_until(lambda: expected in b.log_path.read_text(), 30), b.log_path.read_text()[-2000:]
    finally:
        b.stop()
    assert cluster.brokers() == ["broker-a"]


# ---------------------------------------------------------------- CURVE

@contextlib.contextmanager
def curve_cluster(d: Path):
    """A zmq name server and broker that both serve CURVE only and let in the broker's and the
    client's keys; the broker registers with its own key pair."""
    ns_keys = curve_keys.generate(d, "nameserver")
    broker_keys = curve_keys.generate(d, "broker")
    client_keys = curve_keys.generate(d, "client")
    allowed = d / "allowed"
    allowed.mkdir()
    for public, _ in (broker_keys, client_keys):
        (allowed / public.name).write_bytes(public.read_bytes())
    ns = NameServerProcess(d, transport="zmq", extra_args=["--curve-secret-key", str(ns_keys[1]),
                                                           "--curve-allowed-keys", str(allowed)])
    with ns:
        b = BrokerProcess(d / "broker-z", transport="zmq", env={"EQUEUE_LINK_CURVE_SERVER_KEY": str(ns_keys[0])},
                          extra_args=["--curve-secret-key", str(broker_keys[1]), "--curve-allowed-keys",
                                      str(allowed), *cluster_args([ns], "broker-z")])
        with b.start():
            yield ns, {"curve_server_key": str(ns_keys[0]), "curve_secret_key": str(client_keys[1])}


def test_a_curve_name_server_registers_a_curve_broker_and_refuses_a_plaintext_client(tmp_path):
    with curve_cluster(tmp_path) as (ns, creds):
        with NameServerClient(ns.address, **creds) as client:
            assert wait_until(lambda: [b.name for b in client.cluster_info().brokers] == ["broker-z"], 30)
        with NameServerClient(ns.address) as plain:
            with pytest.raises(HandshakeRefusedError, match="requires CURVE"):
                plain.cluster_info()
