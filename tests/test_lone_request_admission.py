"""The TCP server's shortcut for the one frame of a read (a peer that waits for each answer, as a
one-by-one `Producer.send` does): the request runs in the read callback without the admission's
offer/start hand-offs, so these tests pin that it counts exactly as the general path: after an
answer given at once nothing is left charged or running, a request whose answer waits (handle_now
hands back an awaitable) is running and charged until it is answered, failures and one-way
frames leave nothing behind, and the answers are the general path's."""

from __future__ import annotations

import asyncio

import pytest

from equeue_core import frame as wire
from equeue_core.admission import REQUEST_COST
from equeue_core.frame import Frame
from tests.conformance.transports.harness import ECHO, FAIL, HOLD, run, serving, wait_until
from tests.conformance.transports.test_immediate_handler import ImmediateHandler


def admission_of(server):
    (conn,) = server.connections.values()
    adm = conn._admission
    return adm.running, adm.charged, len(adm.backlog)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_requests_sent_one_at_a_time_leave_nothing_charged_or_running_in_the_admission(loop: str) -> None:
    async def main() -> None:
        async with serving("tcp", ImmediateHandler()) as (handler, server, client):
            for i in range(50):
                reply = await client.request(Frame(ECHO, header={"i": i}, body=b"x" * i), 10)
                assert reply.header == {"i": i} and bytes(reply.body) == b"x" * i
                assert admission_of(server) == (0, 0, 0)
            failed = await client.request(Frame(FAIL), 10)
            assert failed.is_error and "scripted failure" in failed.header["message"]
            assert admission_of(server) == (0, 0, 0)
            await client.send_oneway(Frame(ECHO, header={"oneway": 1}))
            await wait_until(lambda: len(handler.oneway) == 1, what="the one-way frame")
            assert admission_of(server) == (0, 0, 0)
            assert handler.now_calls == 52  # every one went through handle_now
    run(loop, main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_lone_request_whose_answer_waits_stays_running_and_charged_until_it_is_answered(loop: str) -> None:
    async def main() -> None:
        async with serving("tcp", ImmediateHandler()) as (handler, server, client):
            held = asyncio.ensure_future(client.request(Frame(HOLD, header={"h": 1}), 30))
            await wait_until(lambda: handler.holding == 1, what="the held request")
            assert admission_of(server) == (1, wire.HEAD_SIZE + REQUEST_COST, 0)
            handler.release.set()
            assert (await held).header == {"released": True}
            await wait_until(lambda: admission_of(server) == (0, 0, 0), what="the admission emptied")
            reply = await client.request(Frame(ECHO, header={"after": 1}), 10)
            assert reply.header == {"after": 1}
            assert admission_of(server) == (0, 0, 0)
    run(loop, main)
