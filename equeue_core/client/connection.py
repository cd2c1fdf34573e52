"""A client's connection to one broker: transport by address scheme, errors back into exceptions."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from equeue_core import signing
from equeue_core.client.address import Address, parse_address
from equeue_core.contracts import ClientConnection, TransportSettings
from equeue_core.errors import ClientClosedError, ConfigError, EQueueError, error_for_code
from equeue_core.frame import Frame
from equeue_core.plugins import get_plugin_manager

log = logging.getLogger("equeue.client")

DEFAULT_TIMEOUT = 30.0


def raise_for_error(frame: Frame) -> Frame:
    """Return a normal response frame; raise the typed error an error frame carries."""
    if frame.is_error:
        h = frame.header if isinstance(frame.header, dict) else {}
        code = str(h.get("error", "error"))
        details = h.get("details") if isinstance(h.get("details"), dict) else {}
        raise error_for_code(code)(str(h.get("message", code)), **details)
    return frame


def resolve_credentials(access_key: str | None, secret_key: str | None) -> tuple[str, bytes] | None:
    """(access key, secret) from the arguments, else EQUEUE_ACCESS_KEY/EQUEUE_SECRET_KEY; None for an
    unsigned client. One without the other is a configuration error."""
    ak = access_key if access_key is not None else os.environ.get("EQUEUE_ACCESS_KEY") or None
    sk = secret_key if secret_key is not None else os.environ.get("EQUEUE_SECRET_KEY") or None
    if ak is None and sk is None:
        return None
    if not ak or not sk:
        raise ConfigError("access_key and secret_key go together (or EQUEUE_ACCESS_KEY and EQUEUE_SECRET_KEY)")
    return ak, sk.encode()


def with_tls(settings: TransportSettings, tls_ca: str | None, tls_cert: str | None,
             tls_key: str | None) -> TransportSettings:
    """`settings` with the client's TLS files (arguments, else EQUEUE_TLS_CA/_CERT/_KEY); the
    tls:// transport uses them, the others ignore them."""
    files = {name: value if value is not None else os.environ.get("EQUEUE_" + name.upper(), "")
             for name, value in (("tls_ca", tls_ca), ("tls_cert", tls_cert), ("tls_key", tls_key))}
    if not any(files.values()):
        return settings
    return dataclasses.replace(settings, **files)


def signed_header(credentials: tuple[str, bytes] | None, code: int, header: dict[str, Any] | None,
                  body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The header to send: as given without credentials, else signed with a fresh timestamp and
    nonce (docs/security.md)."""
    if credentials is None:
        return header or {}
    return signing.sign(int(code), header or {}, body, *credentials)


class BrokerConnection:
    """Requests to one broker. Reconnects are the transport's job; this maps frames to results.

    With credentials (docs/security.md) every request and one-way frame is signed here, with a
    fresh timestamp and nonce, so a retry is a new signed request."""

    def __init__(self, address: str | Address, settings: TransportSettings | None = None,
                 on_push: Callable[[Frame], Any] | None = None, *, access_key: str | None = None,
                 secret_key: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        self.address = parse_address(address) if isinstance(address, str) else address
        self._credentials = resolve_credentials(access_key, secret_key)
        self.settings = with_tls(settings or TransportSettings(), tls_ca, tls_cert, tls_key)
        self._on_push = on_push
        self._conn: ClientConnection | None = None
        self._closed = False

    async def connect(self) -> BrokerConnection:
        transport = get_plugin_manager().transport(self.address.transport)
        self._conn = await transport.connect(self.address.host, self.address.port, self.settings,
                                             self._push)
        return self

    def _push(self, frame: Frame) -> Any:
        """Hand a push to on_push and return what it returns: the transport runs an awaitable
        result as a task (equeue_core/push.py), so an async on_push is awaited, not dropped."""
        if self._on_push is not None:
            try:
                return self._on_push(frame)
            except Exception:
                log.exception("push handler failed")
        return None

    async def request(self, code: int, header: dict[str, Any] | None = None, body: bytes = b"",
                      timeout: float = DEFAULT_TIMEOUT) -> Frame:
        if self._closed or self._conn is None:
            raise ClientClosedError("the connection is closed")
        resp = await self._conn.request(Frame(int(code), 0, 0, self._signed(code, header, body), body), timeout)
        return raise_for_error(resp)

    def _signed(self, code: int, header: dict[str, Any] | None, body: bytes) -> dict[str, Any]:
        return signed_header(self._credentials, code, header, body)

    async def oneway(self, code: int, header: dict[str, Any] | None = None, body: bytes = b"") -> None:
        if self._closed or self._conn is None:
            raise ClientClosedError("the connection is closed")
        from equeue_core.frame import FLAG_ONEWAY

        await self._conn.send_oneway(Frame(int(code), 0, FLAG_ONEWAY, self._signed(code, header, body), body))

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            try:
                await self._conn.close()
            except EQueueError:
                pass
