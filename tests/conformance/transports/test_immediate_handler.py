"""The optional fast path of the handler contract (contracts.ImmediateServerHandler): a transport
may answer a request whose code is in `now_codes` through `handle_now`, at arrival and without a
task, or ignore it and call `handle`. Either way every transport must give the same answers,
keep the arrival order of the handler's synchronous parts per connection across both paths,
await what `handle_now` hands back, and turn a failure into an error response.
"""

from __future__ import annotations

import asyncio

import pytest

from equeue_core.frame import Frame

from .harness import ECHO, FAIL, HOLD, SLEEP, ScriptedHandler, run, serving, transport_names, wait_until

pytestmark = [
    pytest.mark.parametrize("name", transport_names()),
    pytest.mark.parametrize("loop", ["asyncio", "uvloop"]),
]


class ImmediateHandler(ScriptedHandler):
    """ScriptedHandler that also answers ECHO, FAIL and HOLD through handle_now (HOLD by handing
    back an awaitable); SLEEP stays on the task path. `now_calls` counts what came that way."""

    now_codes = frozenset({ECHO, FAIL, HOLD})

    def __init__(self) -> None:
        super().__init__()
        self.now_calls = 0

    def handle_now(self, conn, frame: Frame):
        self.now_calls += 1
        if self.record(conn, frame):
            return None
        if frame.code == ECHO:
            return frame.response(frame.header, frame.body)
        if frame.code == FAIL:
            raise RuntimeError("scripted failure")
        return self.hold(frame)


def test_immediate_and_task_requests_reach_the_handler_in_arrival_order(name: str, loop: str) -> None:
    """ECHO may be answered at arrival, SLEEP goes through a task: sent interleaved on one
    connection, the handler still sees them in the order they were sent."""
    async def main() -> None:
        async with serving(name, ImmediateHandler()) as (handler, _server, client):
            frames = [Frame(SLEEP, header={"i": i, "seconds": 0}) if i % 3 == 0 else Frame(ECHO, header={"i": i})
                      for i in range(600)]
            replies = await asyncio.gather(*(client.request(f, 30) for f in frames))
            assert all(not r.is_error for r in replies)
            assert [f.header["i"] for f in handler.requests] == list(range(600))
    run(loop, main)


def test_immediate_handler_failures_awaitables_and_oneway_frames(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name, ImmediateHandler()) as (handler, _server, client):
            failed = await client.request(Frame(FAIL), 10)
            assert failed.is_error and "scripted failure" in failed.header["message"]
            held = asyncio.ensure_future(client.request(Frame(HOLD), 30))
            await wait_until(lambda: handler.holding == 1, what="the held request")
            assert not held.done()
            echoed = await client.request(Frame(ECHO, header={"after": "hold"}, body=b"x"), 10)
            assert echoed.header == {"after": "hold"} and bytes(echoed.body) == b"x"
            handler.release.set()
            assert (await held).header == {"released": True}
            await client.send_oneway(Frame(ECHO, header={"oneway": 1}))
            await wait_until(lambda: len(handler.oneway) == 1, what="the one-way frame")
            reply = await client.request(Frame(ECHO, header={"last": 1}), 10)
            assert reply.header == {"last": 1}
    run(loop, main)
