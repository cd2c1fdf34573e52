"""The `tcp` transport: length-prefixed frames (equeue_core.frame) over asyncio TCP.

Registered through the `equeue` entry point `transport_tcp`, exactly as a third-party transport
would be. docs/protocol.md describes what goes over the wire.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from equeue_plugins.transport_tcp import tls
from equeue_plugins.transport_tcp.blocking import BlockingTcpConnection
from equeue_plugins.transport_tcp.client import TcpClientConnection
from equeue_plugins.transport_tcp.server import TcpServer

from equeue_core import frame as wire
from equeue_core.contracts import ServerHandler, TransportSettings
from equeue_core.hookspecs import hookimpl


class TcpTransport:
    """Serve and connect over TCP. Stateless: every server and connection owns its own sockets."""

    name = "tcp"

    async def serve(self, host: str, port: int, handler: ServerHandler,
                    settings: TransportSettings) -> TcpServer:
        """Listen on (host, port) (port 0: an ephemeral port, see `TcpServer.address`)."""
        server = TcpServer(handler, settings)
        await server.start(host, port)
        return server

    async def connect(self, host: str, port: int, settings: TransportSettings,
                      on_push: Callable[[wire.Frame], object] | None = None) -> TcpClientConnection:
        """An open connection; TransportError if the server cannot be reached in connect_timeout."""
        conn = TcpClientConnection(host, port, settings, on_push, self._client_tls(settings))
        await conn.connect()
        return conn

    def connect_blocking(self, host: str, port: int, settings: TransportSettings) -> BlockingTcpConnection:
        """A blocking connection for requests made in the caller's own thread (blocking.py);
        it connects on its first request."""
        return BlockingTcpConnection(host, port, settings, self._client_tls(settings))

    def _client_tls(self, settings: TransportSettings) -> ssl.SSLContext | None:
        return None


class TlsTransport(TcpTransport):
    """`tls://host:port`: the TCP transport with TLS (tls.py). A server serves TLS when its
    settings carry tls_cert/tls_key, whichever of the two names it was started under."""

    name = "tls"

    def _client_tls(self, settings: TransportSettings) -> ssl.SSLContext | None:
        return tls.client_context(settings)


@hookimpl
def equeue_transports() -> dict:
    return {"tcp": TcpTransport(), "tls": TlsTransport()}
