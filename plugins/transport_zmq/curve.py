"""CURVE for the ZeroMQ transport (docs/security.md, "CURVE"): socket options, the ZAP handler that
lets in only allowed client keys, and the client's reading of handshake failures.

Guarantees:
- A server with `curve_secret_key` speaks CURVE only: ZeroMQ itself refuses a plaintext (NULL)
  peer and a peer that encrypts to another server key, before any frame reaches the broker.
- With `curve_allowed_keys` a ZAP handler (inproc://zeromq.zap.01 in the server's own context,
  driven on the event loop like every other socket) answers each handshake: 200 for a listed key,
  400 for any other. The list is re-read when the file or directory changes (checked at most once
  a second, when a handshake asks); a list that no longer parses keeps the last good one. Refusals
  are counted and logged at most once a second.
- A client learns of a refused handshake from ZeroMQ's socket monitor (EVENT_HANDSHAKE_FAILED_*)
  and `describe_refusal` turns it into one HandshakeRefusedError line naming the likely cause.
"""

from __future__ import annotations

import logging
import time

import zmq
from equeue_plugins.transport_zmq.pump import SocketPump
from zmq.utils import z85

from equeue_core import curve_keys
from equeue_core.contracts import TransportSettings
from equeue_core.errors import ConfigError, HandshakeRefusedError

log = logging.getLogger("equeue.security")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"equeue"
RELOAD_CHECK_S = 1.0
MESSAGE_OVERHEAD = 256  # bytes a CURVE MESSAGE command adds to a part (33 today), with room to spare
LOG_EVERY_S = 1.0

HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def _bytes(key: str) -> bytes:
    return key.encode("ascii")


def configure_server(sock: zmq.Socket, settings: TransportSettings) -> None:
    """Make `sock` a CURVE server (before bind); nothing when settings carry no secret key."""
    if not settings.curve_secret_key:
        return
    try:
        sock.curve_secretkey = _bytes(settings.curve_secret_key)
        sock.curve_publickey = _bytes(settings.curve_public_key or curve_keys.derive_public(settings.curve_secret_key))
        sock.curve_server = True
    except zmq.ZMQError as e:
        raise ConfigError(f"CURVE server key rejected by ZeroMQ: {e}") from None
    sock.zap_domain = ZAP_DOMAIN


def configure_client(sock: zmq.Socket, settings: TransportSettings) -> str | None:
    """Make `sock` a CURVE client (before connect) when settings name the server's key; returns the
    client's public key (an ephemeral pair when none is configured), else None."""
    if not settings.curve_server_key:
        return None
    if settings.curve_secret_key:
        public = settings.curve_public_key or curve_keys.derive_public(settings.curve_secret_key)
        secret = settings.curve_secret_key
    else:
        public, secret = (k.decode() for k in zmq.curve_keypair())
    try:
        sock.curve_serverkey = _bytes(settings.curve_server_key)
        sock.curve_publickey = _bytes(public)
        sock.curve_secretkey = _bytes(secret)
    except zmq.ZMQError as e:
        raise ConfigError(f"CURVE key rejected by ZeroMQ: {e}") from None
    return public


def describe_refusal(event: int, value: int, address: str, client_key: str | None) -> HandshakeRefusedError:
    """One clear line for a handshake failure the client's monitor reported."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return HandshakeRefusedError(
            f"{address} refused this client's CURVE key {client_key} (ZAP status {value}): it is not among "
            f"the server's allowed keys", status=int(value))
    if client_key is None:
        return HandshakeRefusedError(
            f"the ZeroMQ handshake with {address} failed: the server most likely requires CURVE "
            f"(give curve_server_key=, or EQUEUE_CURVE_SERVER_KEY)")
    return HandshakeRefusedError(
        f"the CURVE handshake with {address} failed: wrong curve_server_key for this server, "
        f"or the server does not serve CURVE")


class RateLimitedLog:
    """Warnings on `equeue.security`, at most one a second, each with a count of the ones held back:
    a flood of refused handshakes cannot flood the log."""

    def __init__(self) -> None:
        self.count = 0
        self._last = 0.0
        self._held = 0

    def warn(self, msg: str, *args: object) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last < LOG_EVERY_S:
            self._held += 1
            return
        held, self._held, self._last = self._held, 0, now
        log.warning(msg + (f" (+{held} more held back)" if held else ""), *args)


_PROTOCOL_FAILURES = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "mechanism mismatch: a plaintext (NULL) client on this CURVE port",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "cryptographic failure: a client with the wrong server key, "
                                                "or one whose public and secret keys do not match",
}


def note_server_handshake_failure(failures: RateLimitedLog, event: int, value: int) -> None:
    """Log a failed handshake the server's monitor saw (ZAP refusals are logged by the ZapHandler,
    which knows the peer and key; ZeroMQ names neither here)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return
    why = _PROTOCOL_FAILURES.get(value, f"ZeroMQ protocol error {value:#x}" if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                 else "the peer closed during the handshake")
    failures.warn("a CURVE handshake failed: %s", why)


class ZapHandler:
    """Answers ZAP requests for one server context from the allowed-keys file or directory."""

    def __init__(self, ctx: zmq.Context, path: str) -> None:
        self.path = path
        self._version = curve_keys.allowed_keys_version(path)
        self.allowed = {z85.decode(k) for k in curve_keys.allowed_keys(path)}  # bad at start: fatal
        self._checked = time.monotonic()
        self.refusals = RateLimitedLog()
        self.reloads = 0
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.bind(ZAP_ENDPOINT)
        self._pump = SocketPump(self._sock, self._on_request)

    def _reload_if_changed(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        version = curve_keys.allowed_keys_version(self.path)
        if version == self._version:
            return
        self._version = version
        try:
            self.allowed = {z85.decode(k) for k in curve_keys.allowed_keys(self.path)}
        except ConfigError as e:
            log.error("CURVE allowed keys not reloaded, keeping the last good ones (%d keys): %s",
                      len(self.allowed), e)
            return
        self.reloads += 1
        log.info("CURVE allowed keys %s reloaded: %d keys", self.path, len(self.allowed))

    def _on_request(self, msg: list[zmq.Frame]) -> None:
        parts = [p.bytes for p in msg]
        # ROUTER: [peer id, empty delimiter, version, request id, domain, address, identity,
        # mechanism, credentials...]
        if len(parts) < 8 or parts[1] != b"":
            return
        peer, _, version, request_id, _domain, address, _identity, mechanism, *credentials = parts
        try:
            self._reload_if_changed()
            key = credentials[0] if mechanism == b"CURVE" and credentials else b""
            if key in self.allowed:
                reply = [b"200", b"OK", z85.encode(key)]
            else:
                reply = [b"400", b"CURVE key not allowed", b""]
                shown = z85.encode(key).decode() if len(key) == 32 else "-"
                self.refusals.warn("peer=%s: CURVE key %s not allowed, handshake refused",
                                   address.decode("ascii", "replace"), shown)
        except Exception:  # a bug refuses this handshake; it never leaves ZeroMQ waiting for an answer
            log.exception("ZAP request failed")
            reply = [b"500", b"internal error", b""]
        self._pump.send([peer, b"", version, request_id, *reply, b""])

    def close(self) -> None:
        self._pump.close()
        self._sock.close(linger=0)
