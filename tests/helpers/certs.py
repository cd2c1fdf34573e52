"""Throw-away certificates for TLS tests, made with the `openssl` command line (Makefile
DEBIAN_TEST_PACKAGES installs it): a CA, a server certificate for IP 127.0.0.1 and a client
certificate, both signed by that CA; and an unrelated second CA to play the wrong one."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
             cwd=d)


def _leaf(d: Path, name: str, ca: str, ext: str) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "server", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
                 d / "other-ca.pem")


_session: Certs | None = None


def session_certs() -> Certs:
    """One set of certificates for the whole test process (made on first use, in a temp dir):
    what a broker started on the `tls` transport serves when its test gives no certificates."""
    global _session
    if _session is None:
        import atexit
        import shutil
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="equeue-test-certs-"))
        atexit.register(shutil.rmtree, d, True)
        _session = make_certs(d)
    return _session
