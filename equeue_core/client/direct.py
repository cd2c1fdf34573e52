"""Requests made in the caller's own thread, over a blocking connection of the same transport.

The blocking clients run their async engines on one background loop thread (loop.py). For a
request the caller waits on anyway (a synchronous `Producer.send`), the hop into that thread and
back costs two thread wake-ups per round trip, and a caller that keeps its thread busy between
sends starves the loop thread through the GIL. A DirectConnection skips both: the caller encodes,
writes and waits in `recv` (which releases the GIL) itself.

Only transports that offer `connect_blocking` (contracts.BlockingClientConnection; tcp and tls
do) get one; the others keep the loop path. One request at a time: `try_request` returns None at
once when another thread is using it, so concurrent callers fall back to the loop path, which
pipelines them.
"""

from __future__ import annotations

import threading
from typing import Any

from equeue_core.client.connection import BrokerConnection, raise_for_error, signed_header
from equeue_core.contracts import BlockingClientConnection
from equeue_core.frame import FLAG_ERROR, Frame
from equeue_core.plugins import get_plugin_manager


class DirectConnection:
    """Blocking requests to one broker (see the module docstring)."""

    def __init__(self, conn: BlockingClientConnection, credentials: tuple[str, bytes] | None) -> None:
        self._conn = conn
        self._credentials = credentials
        self._lock = threading.Lock()
        self._closed = False
        # a transport's optional request_encoded(code, header bytes, body, timeout) (tcp, tls):
        # the same request with a header the caller encoded once and reuses (try_request_encoded)
        self._request_encoded = getattr(conn, "request_encoded", None)

    @classmethod
    def of(cls, broker: BrokerConnection) -> DirectConnection | None:
        """A direct twin of `broker` (same address, settings, credentials), or None when its
        transport has no blocking connections."""
        transport = get_plugin_manager().transport(broker.address.transport)
        connect_blocking = getattr(transport, "connect_blocking", None)
        if connect_blocking is None:
            return None
        conn = connect_blocking(broker.address.host, broker.address.port, broker.settings)
        return cls(conn, broker._credentials)

    def try_request(self, code: int, header: dict[str, Any] | None, body: bytes,
                    timeout: float) -> Frame | None:
        """The response (typed EQueueError for an error response, TransportError subclasses for
        a lost connection or a timeout), or None without sending if another thread holds this
        connection or it is closed. `code` is an int (a Code member is one)."""
        if self._closed or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                return None
            if self._credentials is not None:
                header = signed_header(self._credentials, code, header, body)
            response = self._conn.request(Frame(code, 0, 0, header or {}, body), timeout)
            return raise_for_error(response) if response.flags & FLAG_ERROR else response
        finally:
            self._lock.release()

    def try_request_encoded(self, code: int, header: dict[str, Any], header_b: bytes, body: bytes,
                            timeout: float, spin: bool = False) -> Frame | None:
        """`try_request` with `header_b`, the caller's frame.encode_header(header) (a producer
        reuses the bytes for every send to a queue). Same answers and errors; a connection with
        credentials signs `header` (the signature covers the request) and a transport without
        request_encoded encodes it, exactly as try_request does. `spin`: a request the broker
        answers at once, worth waiting for without sleeping first (the transport's
        request_encoded decides how; tcp: ANSWER_SPIN_S)."""
        request_encoded = self._request_encoded
        if self._credentials is not None or request_encoded is None:
            return self.try_request(code, header, body, timeout)
        if self._closed or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                return None
            response = request_encoded(code, header_b, body, timeout, spin=spin)
            return raise_for_error(response) if response.flags & FLAG_ERROR else response
        finally:
            self._lock.release()

    def close(self) -> None:
        """Close for good; a request in progress finishes first."""
        self._closed = True
        with self._lock:
            self._conn.close()
