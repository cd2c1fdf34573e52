"""The optional `write_from_thread` of a client connection (contracts.ThreadWritableConnection;
a blocking Producer's send_async lane): every transport whose connections offer it passes these,
on both event loops. What it must keep: a written request's `done` runs once, on the loop's
thread, with its own answer; a refused write (False) writes nothing and never calls `done`; an
unanswered request fails with RequestTimeoutError, a dropped connection with ConnectionLostError,
and a later write goes out on a new connection."""

from __future__ import annotations

import asyncio
import threading

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
    timed_out_once,
    wait_until,
)

HOST = "127.0.0.1"


OFFERING = offering("write_from_thread")
each = each_of(OFFERING)


def test_tcp_offers_it() -> None:
    assert "tcp" in OFFERING


async def _write_from_other_thread(client, loop, frames: list[tuple[int, dict, bytes, float]],
                                   done) -> list[bool]:
    """Call write_from_thread for each frame from a thread that is not the loop's."""
    written: list[bool] = []

    def writer() -> None:
        for code, header, body, timeout in frames:
            written.append(client.write_from_thread(loop, code, encode_header(header), body, timeout, done))

    thread = threading.Thread(target=writer)
    thread.start()
    await asyncio.to_thread(thread.join, 10)
    return written


@each
def test_answers_come_back_to_their_own_done_on_the_loop_thread(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (_handler, _server, client):
            await client.request(Frame(ECHO), 5)
            loop_ = asyncio.get_running_loop()
            loop_thread = threading.get_ident()
            answers = OwnAnswers()

            written: list[bool] = []
            for i in range(200):
                written += await _write_from_other_thread(
                    client, loop_, [(ECHO, {"i": i}, f"b{i}".encode(), 5.0)], answers.done_for(i))
            await wait_until(lambda: len(answers.seen) == written.count(True), what="every written request answered")
            await asyncio.sleep(0.05)
            assert len(answers.seen) == written.count(True)  # a refused write never calls done
            assert all(answers.seen[i] == (i, f"b{i}".encode()) for i in answers.seen)
            assert answers.threads <= {loop_thread}
            if name == "tcp":
                assert all(written)
    run(loop, main)


@each
def test_an_unanswered_request_times_out(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (_handler, _server, client):
            await client.request(Frame(ECHO), 5)
            loop_ = asyncio.get_running_loop()
            outcome: list[BaseException | None] = []
            written = await _write_from_other_thread(
                client, loop_, [(SLEEP, {"seconds": 5.0}, b"", 0.2)], lambda fut: outcome.append(fut.exception()))
            if not written[0]:
                await asyncio.sleep(0.3)
                assert outcome == []
                return
            await timed_out_once(outcome, loop_.time())
    run(loop, main)


@each
def test_a_dropped_connection_fails_the_request_and_a_later_write_reconnects(name: str, loop: str) -> None:
    async def main() -> None:
        async with Restartable(name) as r:
            client = r.client
            await client.request(Frame(ECHO), 5)
            loop_ = asyncio.get_running_loop()
            outcome: list[BaseException | None] = []
            written = await _write_from_other_thread(
                client, loop_, [(SLEEP, {"seconds": 30.0}, b"", 30.0)], lambda fut: outcome.append(fut.exception()))
            if written[0]:
                await lost_by_a_server_stop(r, outcome)
            else:
                await r.server.close()
            await r.restart()
            answers: list[object] = []
            later = False
            for _ in range(30):  # refused until the connection is open again (it reconnects itself)
                later = (await _write_from_other_thread(
                    client, loop_, [(ECHO, {"n": 1}, b"again", 5.0)], lambda fut: answers.append(fut.result())))[0]
                if later:
                    break
                await asyncio.sleep(0.1)
            if name == "tcp":
                assert later
            if later:
                await wait_until(lambda: bool(answers), what="the answer after the reconnect")
                assert bytes(answers[0].body) == b"again"
    run(loop, main)
