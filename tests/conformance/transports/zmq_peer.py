"""A ZeroMQ server or client in its own process, for the liveness tests (which freeze it with
SIGSTOP). Usage: zmq_peer.py server | zmq_peer.py client PORT. Prints one line when ready and runs
until killed (at most 120 s)."""

from __future__ import annotations

import asyncio
import sys

from equeue_plugins.transport_zmq.plugin import ZmqTransport

from equeue_core.contracts import TransportSettings
from equeue_core.frame import Frame

HOLD = 4


class Holder:
    async def handle(self, conn, frame: Frame) -> Frame | None:
        if frame.code == HOLD:
            await asyncio.sleep(120)
        return frame.response(frame.header, frame.body)

    def connection_lost(self, conn) -> None:
        pass


async def main() -> None:
    transport = ZmqTransport(heartbeat_interval=0.2, heartbeat_timeout=1.0)
    if sys.argv[1] == "server":
        server = await transport.serve("127.0.0.1", 0, Holder(), TransportSettings())
        print(server.address[1], flush=True)
        await asyncio.sleep(120)
        await server.close()
    else:
        client = await transport.connect("127.0.0.1", int(sys.argv[2]), TransportSettings())
        await client.request(Frame(1), 5)
        task = asyncio.ensure_future(client.request(Frame(HOLD), 120))
        print("ready", flush=True)
        try:
            await asyncio.wait_for(task, 120)
        finally:
            await client.close()


if __name__ == "__main__":
    asyncio.run(main())
