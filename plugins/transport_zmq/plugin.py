"""The `zmq` transport: the same frames (equeue_core.frame) over ZeroMQ ROUTER/DEALER sockets.

Registered through the `equeue` entry point `transport_zmq`, exactly as a third-party transport
would be. docs/protocol.md describes how frames map onto ZeroMQ messages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from equeue_core import frame as wire
from equeue_core.contracts import ServerHandler, TransportSettings
from equeue_core.hookspecs import hookimpl

if TYPE_CHECKING:
    from equeue_plugins.transport_zmq.client import ZmqClientConnection
    from equeue_plugins.transport_zmq.server import ZmqServer


class ZmqTransport:
    """Serve (ROUTER) and connect (DEALER) over ZeroMQ.

    ZMTP heartbeats run every `heartbeat_interval` seconds on both ends; a peer that answers none of
    them for `heartbeat_timeout` seconds is disconnected, which fails the client's in-flight requests
    (ConnectionLostError) and reports the client lost on the server. TransportSettings has no field
    for these, so they are the transport's own (defaults: 1 s and 5 s).

    pyzmq is imported by the first serve() or connect(), not when the plugin registers: every
    broker and client asks for the transports by name, and one on tcp never needs pyzmq.
    """

    name = "zmq"

    def __init__(self, heartbeat_interval: float = 1.0, heartbeat_timeout: float = 5.0) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout

    async def serve(self, host: str, port: int, handler: ServerHandler,
                    settings: TransportSettings) -> ZmqServer:
        """Bind a ROUTER on (host, port) (port 0: an ephemeral port, see `ZmqServer.address`)."""
        from equeue_plugins.transport_zmq.server import ZmqServer

        server = ZmqServer(handler, settings, self.heartbeat_interval, self.heartbeat_timeout)
        await server.start(host, port)
        return server

    async def connect(self, host: str, port: int, settings: TransportSettings,
                      on_push: Callable[[wire.Frame], object] | None = None) -> ZmqClientConnection:
        """A connected DEALER; TransportError if no handshake completes within connect_timeout."""
        from equeue_plugins.transport_zmq.client import ZmqClientConnection

        conn = ZmqClientConnection(host, port, settings, on_push,
                                   self.heartbeat_interval, self.heartbeat_timeout)
        await conn.connect()
        return conn


@hookimpl
def equeue_transports() -> dict:
    return {"zmq": ZmqTransport()}
