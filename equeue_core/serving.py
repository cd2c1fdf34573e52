"""What a server (broker or name server) serves with, from its Config: one function each, so both
speak the same TLS, CURVE and access control (docs/security.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from equeue_core import curve_keys
from equeue_core.config import Config
from equeue_core.contracts import TransportSettings

if TYPE_CHECKING:
    from equeue_core.broker.access_gate import AccessGate
    from equeue_core.plugins import PluginManager


def server_settings(cfg: Config) -> TransportSettings:
    """Limits, TLS files (tls_server_*) and the CURVE key pair and allowed keys (zmq_curve_*)."""
    curve: dict[str, str] = {}
    if cfg.zmq_curve_secret_key_file:
        public, secret = curve_keys.key_pair(cfg.zmq_curve_secret_key_file, "config zmq_curve_secret_key_file")
        curve = {"curve_public_key": public, "curve_secret_key": secret,
                 "curve_allowed_keys": cfg.zmq_curve_allowed_keys}
    return TransportSettings(max_frame_size=cfg.max_frame_size, frame_read_timeout=cfg.frame_read_timeout_s,
                             max_connections=cfg.max_connections, max_connection_bytes=cfg.max_connection_bytes,
                             idle_timeout=cfg.idle_timeout_s, tls_cert=cfg.tls_server_cert,
                             tls_key=cfg.tls_server_key, tls_ca=cfg.tls_client_ca, **curve)


def access_gate(cfg: Config, plugins: PluginManager) -> AccessGate | None:
    """The configured authorizer behind an AccessGate, or None when access control is off."""
    name = cfg.authorizer_name()
    if not name:
        return None
    from equeue_core.broker.access_gate import AccessGate

    return AccessGate(plugins.authorizer(name)(cfg), name)
