"""Run the console: bind the socket ourselves (a clear error when the port is taken, and port 0
works), then serve the app with uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import errno
import socket

from equeue_core.errors import ConfigError

DEFAULT_CONSOLE = "127.0.0.1:8080"


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror}"
        raise ConfigError(f"console address {host}:{port} {why}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def serve(broker: str, host: str, port: int, sample_interval: float = 5.0, nameserver: str | None = None) -> None:
    import uvicorn

    from equeue_core.console.app import create_app

    sock = bind(host, port)
    address = sock.getsockname()[:2]
    # log_config=None: uvicorn's loggers go through ours (text or JSON, equeue_core.logs).
    config = uvicorn.Config(create_app(broker, sample_interval, nameserver), log_config=None, log_level="warning",
                            lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        shown = f"name servers {nameserver}" if nameserver else f"broker {broker}"
        print(f"equeue console on http://{address[0]}:{address[1]} ({shown})", flush=True)
    await task
