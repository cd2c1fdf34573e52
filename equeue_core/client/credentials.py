"""Client credentials: the one place a client-side link's settings are made (docs/security.md).

Every link that sends requests -- the producer's, consumer's and admin client's connections to
brokers, the name-server client, a broker's registration with its name servers (and a replica's
link to its master) -- takes its TransportSettings and request signer from `client_link`, so TLS
files, CURVE keys and the ACL account reach each one the same way.

Two sources:
- a client's arguments (`access_key=`, `secret_key=`, `tls_ca=`, `tls_cert=`, `tls_key=`,
  `curve_server_key=`, `curve_public_key=`, `curve_secret_key=`): an argument left at None falls
  back to the variable EQUEUE_<NAME>; "" means none (and keeps the variable out).
- a server's Config: the `link_*` keys, what a broker presents on its own outgoing links. The
  clients' EQUEUE_* variables are not read then: a broker started in a client's shell must not
  pick them up.

CURVE values are the key's Z85 text or the path of a key file (equeue_core/curve_keys.py); they are
read here, once per link, so a missing or bad key is one ConfigError before anything connects.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from equeue_core import curve_keys
from equeue_core.contracts import TransportSettings
from equeue_core.errors import ConfigError

if TYPE_CHECKING:
    from equeue_core.config import Config

CREDENTIALS = ("access_key", "secret_key", "tls_ca", "tls_cert", "tls_key",
               "curve_server_key", "curve_public_key", "curve_secret_key")


@dataclasses.dataclass(frozen=True, slots=True)
class ClientLink:
    """What one client-side link connects with."""

    settings: TransportSettings
    signer: tuple[str, bytes] | None  # (access key, secret) signing every request; None: unsigned


def credentials(**given: str | None) -> dict[str, str | None]:
    """The credential arguments of a client constructor, checked and in one dict (None = unset),
    to hand to BrokerConnection / client_link later."""
    unknown = set(given) - set(CREDENTIALS)
    if unknown:
        raise ConfigError(f"unknown credential argument(s): {', '.join(sorted(unknown))}")
    return {name: given.get(name) for name in CREDENTIALS}


def config_credentials(cfg: Config) -> dict[str, str]:
    """A server's own outgoing credentials: its `link_*` keys. The link's CURVE key pair defaults to
    the server's own (zmq_curve_secret_key_file) when it names a server key to reach."""
    values = {name: getattr(cfg, "link_" + name, "") for name in CREDENTIALS if name != "curve_public_key"}
    if values["curve_server_key"] and not values["curve_secret_key"]:
        values["curve_secret_key"] = cfg.zmq_curve_secret_key_file
    return {**values, "curve_public_key": ""}


def client_link(source: Config | Mapping[str, str | None] | None = None,
                settings: TransportSettings | None = None,
                environ: Mapping[str, str] | None = None) -> ClientLink:
    """The settings and signer of one client-side link, from a server's Config or a client's
    arguments (see the module docstring); `settings` carries the rest (timeouts, limits)."""
    from equeue_core.config import Config

    if isinstance(source, Config):
        values = config_credentials(source)
    else:
        env = os.environ if environ is None else environ
        given = credentials(**dict(source or {}))
        values = {name: (v if v is not None else env.get("EQUEUE_" + name.upper(), ""))
                  for name, v in given.items()}
    base = settings or TransportSettings()
    return ClientLink(dataclasses.replace(base, **_tls(values), **_curve(values)), _signer(values))


def _signer(values: Mapping[str, str]) -> tuple[str, bytes] | None:
    ak, sk = values["access_key"], values["secret_key"]
    if not ak and not sk:
        return None
    if not ak or not sk:
        raise ConfigError("access_key and secret_key go together (or EQUEUE_ACCESS_KEY and EQUEUE_SECRET_KEY)")
    return ak, sk.encode()


def _tls(values: Mapping[str, str]) -> dict[str, str]:
    """The tls:// transport uses these; the others ignore them."""
    return {name: values[name] for name in ("tls_ca", "tls_cert", "tls_key") if values[name]}


def _curve(values: Mapping[str, str]) -> dict[str, str]:
    """The zmq transport's client side: the server's public key turns CURVE on."""
    server, secret, public = values["curve_server_key"], values["curve_secret_key"], values["curve_public_key"]
    if not server:
        if secret or public:
            raise ConfigError("curve_secret_key/curve_public_key need curve_server_key (the server's public "
                              "key; or EQUEUE_CURVE_SERVER_KEY)")
        return {}
    out = {"curve_server_key": curve_keys.public_key(server, "curve_server_key")}
    if secret:
        own_public, own_secret = curve_keys.key_pair(secret, "curve_secret_key")
        if public and curve_keys.public_key(public, "curve_public_key") != own_public:
            raise ConfigError("curve_public_key does not belong to curve_secret_key")
        out.update(curve_public_key=own_public, curve_secret_key=own_secret)
    elif public:
        raise ConfigError("curve_public_key needs its curve_secret_key")
    return out
