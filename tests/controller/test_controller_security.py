"""The controller under the same credentials as registration (docs/security.md, docs/controller.md):
a broker in controller mode heartbeats a TLS + ACL name server with its link_* admin account and
is made master; one whose link account is not an admin is refused and never becomes master. Real
processes on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

from equeue_core.client.nameserver import NameServerClient
from tests.helpers.accounts import ACL, APP, ROOT
from tests.helpers.broker import BrokerProcess
from tests.helpers.certs import Certs, make_certs
from tests.helpers.controller import group_view, wait_for_master
from tests.helpers.nameserver import cluster_args, controller_nameservers
from tests.helpers.waiting import wait_until


def _secure_nameservers(d: Path, certs: Certs, acl: Path):
    return controller_nameservers(d, count=3, transport="tls", env={
        "EQUEUE_TLS_SERVER_CERT": str(certs.server_cert), "EQUEUE_TLS_SERVER_KEY": str(certs.server_key),
        "EQUEUE_ACL": "true", "EQUEUE_ACL_FILE": str(acl)})


def _broker(d: Path, certs: Certs, acl: Path, nss, name: str, account: tuple[str, str]) -> BrokerProcess:
    env = {"EQUEUE_LINK_TLS_CA": str(certs.ca), "EQUEUE_LINK_ACCESS_KEY": account[0],
           "EQUEUE_LINK_SECRET_KEY": account[1]}
    return BrokerProcess(d / name, transport="tls", env=env, extra_args=[
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--acl-file", str(acl),
        *cluster_args(nss, name), "--broker-id", "0", "--controller"])


def test_controller_heartbeats_carry_the_brokers_link_credentials_and_non_admins_are_refused(tmp_path):
    certs = make_certs(tmp_path / "certs")
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    nss = _secure_nameservers(tmp_path, certs, acl)
    try:
        for ns in nss:
            ns.start()
        good = _broker(tmp_path, certs, acl, nss, "broker-a", ROOT)
        other = _broker(tmp_path, certs, acl, nss, "broker-x", APP)
        with good.start(), other.start():
            creds = {"tls_ca": str(certs.ca), "access_key": ROOT[0], "secret_key": ROOT[1]}
            refused = "access denied (controller_heartbeat): account 'app' is not an admin"
            with NameServerClient(",".join(ns.address for ns in nss), **creds) as client:
                g = wait_for_master(client, "broker-a", 30)
                assert g["master_address"] == good.address
                # broker-x's heartbeats (and registration) are refused: the controller never
                # heard of it, so it has no group and no master. Its first heartbeat may come
                # after broker-a's election on a loaded machine: wait for the refusal, then look.
                assert wait_until(lambda: refused in other.log_path.read_text(), 30)
                assert group_view(client, "broker-x") is None
    finally:
        for ns in nss:
            ns.stop()
