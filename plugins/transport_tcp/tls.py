"""TLS for the TCP transport (stdlib `ssl`): contexts, and the server's accept loop that tells a TLS
client from a plaintext one before any handshake.

Guarantees:
- A TLS server serves TLS only. Each accepted socket is peeked at (MSG_PEEK, nothing consumed):
  a first byte 0x16 (a TLS handshake record) goes to the handshake and then to the same
  `TcpServerConnection` a plaintext server uses; anything else gets one plain `tls_required` error
  frame (request id 0, docs/protocol.md) and is closed, so a plaintext client fails at once with a
  clear error instead of waiting for its timeout.
- A failed handshake (wrong CA, no client certificate under mutual TLS, garbage after 0x16) is
  logged and closed; the handler never sees the connection and the broker goes on serving.
- A socket that sends nothing for `frame_read_timeout` seconds before the handshake is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import TYPE_CHECKING

from equeue_core import frame as wire
from equeue_core.contracts import TransportSettings
from equeue_core.errors import ConfigError, TlsRequiredError

if TYPE_CHECKING:
    from equeue_plugins.transport_tcp.server import TcpServer

log = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = 0x16  # first byte of every TLS ClientHello
REFUSAL_LINGER = 1.0  # seconds a refused plaintext socket is read (and discarded) before closing


def server_context(settings: TransportSettings) -> ssl.SSLContext:
    """The server side: its certificate, and with tls_ca a required client certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
        if settings.tls_ca:
            ctx.load_verify_locations(cafile=settings.tls_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS certificate/key/CA cannot be loaded: {e}") from None
    return ctx


def client_context(settings: TransportSettings) -> ssl.SSLContext:
    """The client side: verify the server against tls_ca (system CAs if empty) and its host name or
    IP; with tls_cert/tls_key present a client certificate."""
    try:
        ctx = ssl.create_default_context(cafile=settings.tls_ca or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if settings.tls_cert or settings.tls_key:
            ctx.load_cert_chain(settings.tls_cert, settings.tls_key or None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS CA/certificate/key cannot be loaded: {e}") from None
    return ctx


async def accept_forever(server: TcpServer, listener: socket.socket, ctx: ssl.SSLContext) -> None:
    """Accept on `listener` until cancelled; each socket is sniffed in its own task."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()
    try:
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as e:  # EMFILE and the like: back off, keep serving
                log.warning("accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(_sniff(server, sock, ctx))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


async def _sniff(server: TcpServer, sock: socket.socket, ctx: ssl.SSLContext) -> None:
    loop = asyncio.get_running_loop()
    timeout = server.settings.frame_read_timeout
    peer = _peer(sock)
    sock.setblocking(False)
    try:
        first = await _peek(loop, sock, timeout)
        if first == bytes([TLS_HANDSHAKE_RECORD]):
            await loop.connect_accepted_socket(server._new_connection, sock, ssl=ctx,
                                               ssl_handshake_timeout=timeout)
            return
        if first:
            await _refuse_plaintext(loop, sock, peer)
        sock.close()
    except asyncio.CancelledError:
        sock.close()
        raise
    except (OSError, TimeoutError, ssl.SSLError) as e:
        log.info("TLS handshake with %s failed: %s", peer, e)
        sock.close()


async def _peek(loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout: float) -> bytes:
    """The first byte the peer sent, left in the socket; b"" if it closed."""
    ready = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: ready.done() or ready.set_result(None))
    try:
        async with asyncio.timeout(timeout):
            await ready
    finally:
        loop.remove_reader(sock.fileno())
    return sock.recv(1, socket.MSG_PEEK)


async def _refuse_plaintext(loop: asyncio.AbstractEventLoop, sock: socket.socket, peer: str) -> None:
    """Answer a plaintext peer `tls_required` and close. What it sent is read and dropped first,
    and its EOF awaited for up to REFUSAL_LINGER seconds, so the close is not a reset that would
    destroy the error frame before the peer reads it."""
    err = TlsRequiredError(f"this port speaks TLS only: connect with tls://{_local(sock)}")
    log.info("refusing the plaintext connection from %s: %s", peer, err)
    _drain(sock)
    refusal = wire.Frame(0, 0, 0).error_response(err.code, str(err))
    await loop.sock_sendall(sock, b"".join(bytes(b) for b in wire.encode(refusal)))
    sock.shutdown(socket.SHUT_WR)
    try:
        async with asyncio.timeout(REFUSAL_LINGER):
            while await loop.sock_recv(sock, 65536):
                pass
    except (TimeoutError, OSError):
        pass


def _drain(sock: socket.socket) -> None:
    for _ in range(64):  # bounded: at most 4 MiB read and dropped
        try:
            if not sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def _local(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"
