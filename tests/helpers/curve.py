"""Throw-away CURVE keys for zmq tests (docs/security.md, "CURVE"), written by the same
`equeue_core.curve_keys.generate` as `equeue keys generate`: a server pair, an allowed client pair,
another pair nobody allowed, and an allowed-keys directory holding the client's public key only."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from equeue_core import curve_keys


@dataclass(frozen=True)
class CurveKeys:
    server: tuple[Path, Path]  # (public key file, secret key file)
    client: tuple[Path, Path]
    other: tuple[Path, Path]
    allowed: Path  # directory of allowed public keys: client.key only

    def broker_args(self, allowed: bool = True) -> list[str]:
        """Broker (or name server) flags: CURVE only, with the allowed-keys directory."""
        args = ["--curve-secret-key", str(self.server[1])]
        return args + ["--curve-allowed-keys", str(self.allowed)] if allowed else args

    def client_credentials(self) -> dict[str, str]:
        """Client keywords of the allowed client."""
        return {"curve_server_key": str(self.server[0]), "curve_secret_key": str(self.client[1])}


_session: CurveKeys | None = None


def session_curve_keys() -> CurveKeys:
    """One set of keys for the whole test process (made on first use, in a temp dir): what a broker
    started on the `zmq+curve` test transport serves when its test gives no keys."""
    global _session
    if _session is None:
        import atexit
        import shutil
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="equeue-test-curve-"))
        atexit.register(shutil.rmtree, d, True)
        _session = make_curve_keys(d)
    return _session


def make_curve_keys(d: Path) -> CurveKeys:
    d = Path(d)
    server = curve_keys.generate(d, "server")
    client = curve_keys.generate(d, "client")
    other = curve_keys.generate(d, "other")
    allowed = d / "allowed"
    allowed.mkdir()
    shutil.copy(client[0], allowed / "client.key")
    return CurveKeys(server, client, other, allowed)
