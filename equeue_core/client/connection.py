"""A client's connection to one broker: transport by address scheme, errors back into exceptions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from equeue_core import signing
from equeue_core.client.address import Address, parse_address
from equeue_core.client.credentials import ClientLink, client_link
from equeue_core.contracts import ClientConnection, TransportSettings
from equeue_core.errors import ClientClosedError, EQueueError, error_for_code
from equeue_core.frame import Frame, encode_header
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
                 on_push: Callable[[Frame], Any] | None = None, *, link: ClientLink | None = None,
                 **credentials: str | None) -> None:
        """`credentials`: access_key, secret_key, tls_ca/_cert/_key, curve_server_key/_public_key/
        _secret_key (client/credentials.py; None falls back to EQUEUE_*); or a ready `link`."""
        self.address = parse_address(address) if isinstance(address, str) else address
        if link is None:
            link = client_link(credentials, settings)
        self.settings = link.settings
        self._credentials = link.signer
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

    @property
    def callback_requests(self) -> bool:
        """Whether the transport offers `request_now` at all (tcp, tls; not zmq)."""
        return getattr(self._conn, "request_now", None) is not None

    def request_now(self, code: int, header: dict[str, Any], header_b: bytes, body: bytes, timeout: float,
                    done: Callable[[Any], object]) -> bool:
        """`request` in its callback form, on the loop thread, when the transport offers it
        (contracts.CallbackRequestConnection) and can write at once: written in this call, and
        `done(request)` runs once on the loop thread with `request.result()` the raw response
        (errors not mapped: raise_for_error) or `request.exception()` a TransportError. `header_b`
        is `header` encoded (frame.encode_header); with credentials it is signed afresh. False:
        nothing written and `done` never runs (use `request`). FrameTooLargeError: nothing
        written."""
        now = getattr(self._conn, "request_now", None)
        if now is None or self._closed:
            return False
        if self._credentials is not None:
            header_b = encode_header(self._signed(code, header, body))
        return now(int(code), header_b, body, timeout, done)

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
