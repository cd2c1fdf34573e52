"""Pushes from a real broker reach a client's on_push callback, plain or async."""

from __future__ import annotations

import asyncio

from equeue_core.client.connection import BrokerConnection
from equeue_core.codes import Code
from equeue_core.frame import Frame


def test_an_async_on_push_is_awaited_for_a_group_changed_notice(file_broker):
    async def scenario() -> list[dict]:
        got: list[dict] = []
        arrived = asyncio.Event()

        async def on_push(frame: Frame) -> None:
            await asyncio.sleep(0)  # really a coroutine: only runs if someone awaits it
            got.append({"code": frame.code, **frame.header})
            arrived.set()

        first = await BrokerConnection(file_broker.address, on_push=on_push).connect()
        second = await BrokerConnection(file_broker.address).connect()
        try:
            await first.request(Code.HEARTBEAT, {"client_id": "c1", "group": "gpush", "subscriptions": {"t": "*"}})
            # a second member joins: the broker tells the first one its group changed
            await second.request(Code.HEARTBEAT, {"client_id": "c2", "group": "gpush", "subscriptions": {"t": "*"}})
            await asyncio.wait_for(arrived.wait(), 10)
        finally:
            await first.close()
            await second.close()
        return got

    got = asyncio.run(scenario())
    assert got[0] == {"code": Code.GROUP_CHANGED, "group": "gpush"}
