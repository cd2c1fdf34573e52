"""The optional `request_now` of a client connection (contracts.CallbackRequestConnection; the
Producer's `send_async` batches on the loop thread): every transport whose connections offer it
passes these, on both event loops. What it must keep: a request is written in the call, in call
order with the connection's other writes; its `done` runs once, on the loop thread, with its own
answer; a refused request (False) writes nothing and never calls `done`; an unanswered request
fails with RequestTimeoutError and a dropped connection with ConnectionLostError; an oversized
frame raises FrameTooLargeError with nothing written."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from equeue_core.errors import FrameTooLargeError
from equeue_core.frame import Frame, encode_header

from .harness import (
    ECHO,
    SLEEP,
    OwnAnswers,
    Restartable,
    each_of,
    lost_by_a_server_stop,
    offering,
    run,
    serving,
    settings,
    timed_out_once,
    transport,
    wait_until,
)

HOST = "127.0.0.1"


OFFERING = offering("request_now")
each = each_of(OFFERING)


def test_tcp_and_tls_offer_it() -> None:
    assert {"tcp", "tls"} <= set(OFFERING)


def _now(client, code: int, header: dict, body: bytes, timeout: float, done) -> bool:
    return client.request_now(code, encode_header(header), body, timeout, done)


@each
def test_answers_come_back_to_their_own_done_on_the_loop_thread(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (_handler, _server, client):
            await client.request(Frame(ECHO), 5)
            loop_thread = threading.get_ident()
            answers = OwnAnswers()
            written = [_now(client, ECHO, {"i": i}, f"b{i}".encode(), 5.0, answers.done_for(i)) for i in range(200)]
            assert all(written)  # connected, nobody waiting for a turn: every one goes now
            await wait_until(lambda: len(answers.seen) == 200, what="every request answered")
            await asyncio.sleep(0.05)
            assert all(answers.seen[i] == (i, f"b{i}".encode()) for i in range(200))
            assert answers.threads == {loop_thread}
    run(loop, main)


@each
def test_requests_leave_in_the_order_of_the_calls_with_the_connections_other_writes(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (handler, _server, client):
            await client.request(Frame(ECHO, header={"n": -1}), 5)
            answered: list[int] = []
            for n in range(20):
                assert _now(client, ECHO, {"n": n}, b"", 5.0, lambda r: answered.append(r.result().header["n"]))
            last = await client.request(Frame(ECHO, header={"n": 20}), 5)  # a request made after them
            assert last.header["n"] == 20
            await wait_until(lambda: len(answered) == 20, what="the answers")
            assert [f.header["n"] for f in handler.requests] == list(range(-1, 21))
    run(loop, main)


@each
def test_an_unanswered_request_times_out(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (_handler, _server, client):
            await client.request(Frame(ECHO), 5)
            outcome: list[BaseException | None] = []
            started = asyncio.get_running_loop().time()
            assert _now(client, SLEEP, {"seconds": 5.0}, b"", 0.2, lambda r: outcome.append(r.exception()))
            await timed_out_once(outcome, started)
    run(loop, main)


@each
def test_a_dropped_connection_fails_the_request_and_refuses_more_until_a_request_reconnects(name: str,
                                                                                            loop: str) -> None:
    async def main() -> None:
        async with Restartable(name) as r:
            client = r.client
            await client.request(Frame(ECHO), 5)
            outcome: list[BaseException | None] = []
            assert _now(client, SLEEP, {"seconds": 30.0}, b"", 30.0, lambda q: outcome.append(q.exception()))
            await lost_by_a_server_stop(r, outcome)
            refused: list[object] = []
            assert not _now(client, ECHO, {}, b"", 5.0, refused.append)  # no reconnect of its own
            await r.restart()
            await client.request(Frame(ECHO), 5)  # `request` reconnects
            answers: list[object] = []
            assert _now(client, ECHO, {"n": 1}, b"again", 5.0, lambda q: answers.append(q.result()))
            await wait_until(lambda: bool(answers), what="the answer after the reconnect")
            assert bytes(answers[0].body) == b"again"
            assert refused == [] and len(outcome) == 1
    run(loop, main)


@each
def test_a_closed_connection_refuses_and_an_oversized_frame_raises_with_nothing_written(name: str,
                                                                                        loop: str) -> None:
    async def main() -> None:
        async with serving(name, server_settings=settings(max_frame_size=64 * 1024)) as (handler, _server, client):
            await client.request(Frame(ECHO), 5)
            done: list[object] = []
            with pytest.raises(FrameTooLargeError):
                _now(client, ECHO, {}, b"x" * (client.settings.max_frame_size + 1), 5.0, done.append)
            answer = await client.request(Frame(ECHO, header={"after": True}), 5)  # the stream is intact
            assert answer.header == {"after": True}
            assert [f.header for f in handler.requests] == [{}, {"after": True}]
            await client.close()
            assert not _now(client, ECHO, {}, b"", 5.0, done.append)
            await asyncio.sleep(0.05)
            assert done == []
    run(loop, main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tcp_refuses_while_its_writes_are_paused_and_a_waiting_request_keeps_its_place(loop: str) -> None:
    """A server that never reads: once the kernel's buffers are full the transport pauses writing,
    and request_now must refuse rather than pass the `request` that waits for its turn."""
    async def main() -> None:
        listener = socket.create_server((HOST, 0))
        accepted: list[socket.socket] = []
        acceptor = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
        acceptor.start()
        t = transport("tcp")
        client = await t.connect(HOST, listener.getsockname()[1], settings(max_frame_size=8 * 1024 * 1024))
        try:
            done: list[object] = []
            chunk = b"x" * (1024 * 1024)
            written = 0
            for _ in range(400):  # loopback buffers hold a few MB: it pauses well before
                if not _now(client, ECHO, {}, chunk, 30.0, done.append):
                    break
                written += 1
                await asyncio.sleep(0)  # the coalesced write goes out at the end of the turn
            else:
                raise AssertionError("request_now never refused on a connection nobody reads")
            assert written >= 1
            waiting = asyncio.ensure_future(client.request(Frame(ECHO), 30))
            await asyncio.sleep(0.05)
            assert not waiting.done()
            assert not _now(client, ECHO, {}, b"", 30.0, done.append)  # it would pass `waiting`
            assert done == []
            waiting.cancel()
        finally:
            await client.close()
            listener.close()
            acceptor.join(5)
            for s in accepted:
                s.close()
    run(loop, main)
