"""The transport conformance kit: every transport installed under `equeue_transports` passes these,
on both the asyncio and the uvloop event loop. A new transport plugin inherits the whole suite.

Servers listen on 127.0.0.1, port 0 only.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from equeue_core import frame as wire
from equeue_core.errors import (
    ClientClosedError,
    ConnectionLostError,
    FrameTooLargeError,
    RequestTimeoutError,
)
from equeue_core.frame import Frame

from .harness import (
    ECHO,
    FAIL,
    HOLD,
    PUSH,
    SLEEP,
    Restartable,
    ScriptedHandler,
    request_once_reconnected,
    run,
    serving,
    settings,
    transport,
    transport_names,
    wait_until,
)

HOST = "127.0.0.1"

pytestmark = [
    pytest.mark.parametrize("name", transport_names()),
    pytest.mark.parametrize("loop", ["asyncio", "uvloop"]),
]


def test_transport_is_registered_under_its_name(name: str, loop: str) -> None:
    assert "tcp" in transport_names()
    assert transport(name).name == name


def test_echo_round_trip(name: str, loop: str) -> None:
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        assert server.address[0] == HOST and server.address[1] > 0
        client = await t.connect(HOST, server.address[1], settings())
        try:
            reply = await client.request(Frame(ECHO, header={"k": "v", "n": 7}, body=b"hello"), 5)
            assert reply.is_response and not reply.is_error
            assert reply.header == {"k": "v", "n": 7}
            assert bytes(reply.body) == b"hello"
            assert reply.code == ECHO
            # Empty header and body survive too.
            reply = await client.request(Frame(ECHO), 5)
            assert reply.header == {} and bytes(reply.body) == b""
        finally:
            await client.close()
            await server.close()
    run(loop, main)


def test_request_ids_are_assigned_by_the_transport(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (handler, _server, client):
            a, b = Frame(ECHO, request_id=99), Frame(ECHO, request_id=99)
            ra = await client.request(a, 5)
            rb = await client.request(b, 5)
            assert a.request_id != b.request_id
            assert (ra.request_id, rb.request_id) == (a.request_id, b.request_id)
    run(loop, main)


def test_thousand_concurrent_requests_on_one_connection(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (handler, _server, client):
            frames = [Frame(ECHO, header={"i": i}, body=i.to_bytes(4, "little") * (i % 50))
                      for i in range(1000)]
            replies = await asyncio.gather(*(client.request(f, 20) for f in frames))
            for i, reply in enumerate(replies):
                assert reply.header == {"i": i}
                assert bytes(reply.body) == i.to_bytes(4, "little") * (i % 50)
            # The handler saw them in the order they were sent (one connection, arrival order).
            assert [f.header["i"] for f in handler.requests] == list(range(1000))
    run(loop, main)


def test_requests_reach_the_handler_in_call_order_when_the_send_buffer_fills(name: str, loop: str) -> None:
    """A request started each loop turn (as a producer dispatches batches from callbacks), each
    larger than the client's send buffer, to a server that takes one at a time and sleeps a
    millisecond on each: writing pauses and resumes again and again, and a request that starts
    right after a resume must not overtake those still waiting for their turn to write. A
    producer's batches of one queue are such requests: their order is the queue's order
    (tests/test_send_async_order.py)."""
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings(max_requests_in_flight=1, socket_buffer=64 * 1024))
        client = await t.connect(HOST, server.address[1], settings(socket_buffer=64 * 1024))
        try:
            body = os.urandom(96 * 1024)
            count = 120
            tasks: list[asyncio.Future] = []
            running = asyncio.get_running_loop()
            done = running.create_future()

            def spawn() -> None:
                i = len(tasks)
                frame = Frame(SLEEP, header={"i": i, "seconds": 0.001}, body=body)
                tasks.append(asyncio.ensure_future(client.request(frame, 60)))
                if len(tasks) < count:
                    running.call_soon(spawn)
                else:
                    done.set_result(None)

            running.call_soon(spawn)
            await done
            await asyncio.gather(*tasks)
            arrived = [f.header["i"] for f in handler.requests]
            assert arrived == list(range(count)), f"first out of order at {next(i for i, n in enumerate(arrived) if n != i)}"
        finally:
            await client.close()
            await server.close()
    run(loop, main)


def test_oneway_frames_reach_the_handler_and_get_no_response(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (handler, _server, client):
            for i in range(50):
                await client.send_oneway(Frame(ECHO, header={"i": i}, body=b"x" * i))
            await wait_until(lambda: len(handler.oneway) == 50, what="50 one-way frames")
            assert [f.header["i"] for f in handler.oneway] == list(range(50))
            assert all(f.is_oneway for f in handler.oneway)
            assert [bytes(f.body) for f in handler.oneway] == [b"x" * i for i in range(50)]
            # The connection is still in step for requests.
            reply = await client.request(Frame(ECHO, body=b"after"), 5)
            assert bytes(reply.body) == b"after"
    run(loop, main)


def test_server_push_reaches_on_push(name: str, loop: str) -> None:
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        pushed: list[Frame] = []
        async_pushed: list[Frame] = []

        async def on_push_async(f: Frame) -> None:
            await asyncio.sleep(0)
            async_pushed.append(f)

        client = await t.connect(HOST, server.address[1], settings(), on_push=pushed.append)
        client2 = await t.connect(HOST, server.address[1], settings(), on_push=on_push_async)
        try:
            reply = await client.request(Frame(PUSH, header={"count": 20}), 5)
            assert reply.header == {"pushed": 20}
            await wait_until(lambda: len(pushed) == 20, what="20 pushes")
            assert [f.header["n"] for f in pushed] == list(range(20))
            assert all(f.is_push and not f.is_response for f in pushed)
            assert [bytes(f.body) for f in pushed] == [b"p" * i for i in range(20)]
            # Unsolicited, later: push through the connection object the handler saw.
            await client2.request(Frame(ECHO), 5)
            conn1, conn2 = handler.connections.values()  # in order of first request
            assert conn1.id != conn2.id
            conn2.push(Frame(77, header={"late": True}))
            await wait_until(lambda: len(async_pushed) == 1, what="a late push")
            assert async_pushed[0].code == 77 and async_pushed[0].header == {"late": True}
            assert len(pushed) == 20  # went to the other client only
        finally:
            await client.close()
            await client2.close()
            await server.close()
    run(loop, main)


def test_fifteen_mib_frames_round_trip(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (handler, _server, client):
            body = os.urandom(15 * 1024 * 1024)
            replies = await asyncio.gather(*(client.request(Frame(ECHO, header={"i": i}, body=body), 30)
                                             for i in range(3)))
            for i, reply in enumerate(replies):
                assert reply.header == {"i": i}
                assert len(reply.body) == len(body) and bytes(reply.body) == body
    run(loop, main)


def test_frame_over_the_max_gets_a_clear_error(name: str, loop: str) -> None:
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        limit = 1024 * 1024
        server = await t.serve(HOST, 0, handler, settings(max_frame_size=limit))
        # The client refuses before sending when it knows the limit...
        strict = await t.connect(HOST, server.address[1], settings(max_frame_size=limit))
        # ...and the server refuses with an error frame when the client does not.
        lax = await t.connect(HOST, server.address[1], settings())
        try:
            with pytest.raises(FrameTooLargeError):
                await strict.request(Frame(ECHO, body=b"x" * limit), 5)
            with pytest.raises(FrameTooLargeError):
                await strict.send_oneway(Frame(ECHO, body=b"x" * limit))
            # Over the limit by its head and header: the body alone would fit.
            reply = await lax.request(Frame(ECHO, header={"pad": "p" * 100}, body=b"y" * (limit - 8)), 10)
            assert reply.is_error
            assert reply.header["error"] == FrameTooLargeError.code
            assert "maximum" in reply.header["message"]
            assert reply.header["details"]["max"] == limit
            assert not handler.requests  # never reached the handler
            # Both connections are still usable.
            assert bytes((await strict.request(Frame(ECHO, body=b"ok"), 5)).body) == b"ok"
            assert bytes((await lax.request(Frame(ECHO, body=b"ok2"), 5)).body) == b"ok2"
        finally:
            await strict.close()
            await lax.close()
            await server.close()
    run(loop, main)


def test_frame_far_over_the_max_never_reaches_the_handler(name: str, loop: str) -> None:
    """3x the limit: TCP answers with an error frame and skips the bytes; ZeroMQ's MAXMSGSIZE drops
    the sender's connection (ConnectionLostError) before buffering it. Either way the server keeps
    serving and the client's next request works."""
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        limit = 1024 * 1024
        server = await t.serve(HOST, 0, handler, settings(max_frame_size=limit))
        lax = await t.connect(HOST, server.address[1], settings())
        other = await t.connect(HOST, server.address[1], settings())
        try:
            try:
                reply = await lax.request(Frame(ECHO, body=b"y" * (3 * limit)), 10)
                assert reply.is_error and reply.header["error"] == FrameTooLargeError.code
            except ConnectionLostError:
                assert name != "tcp"
            assert not handler.requests
            assert bytes((await other.request(Frame(ECHO, body=b"other"), 5)).body) == b"other"
            reply = await request_once_reconnected(lax, Frame(ECHO, body=b"again"))
            assert bytes(reply.body) == b"again"
        finally:
            await lax.close()
            await other.close()
            await server.close()
    run(loop, main)


def test_handler_failure_becomes_an_error_response(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (_handler, _server, client):
            reply = await client.request(Frame(FAIL), 5)
            assert reply.is_error and "scripted failure" in reply.header["message"]
            reply = await client.request(Frame(123), 5)
            assert reply.is_error and reply.header["error"] == "unknown_request"
    run(loop, main)


def test_client_disconnect_mid_request_cleans_up_the_server(name: str, loop: str) -> None:
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings(frame_read_timeout=2.0))
        client = await t.connect(HOST, server.address[1], settings())
        pending = [asyncio.ensure_future(client.request(Frame(HOLD), 30)) for _ in range(5)]
        try:
            await wait_until(lambda: handler.holding == 5, what="5 held requests")
            assert len(server.connections) == 1
            await client.close()
            for fut in pending:
                with pytest.raises(ConnectionLostError):
                    await fut
            await wait_until(lambda: len(handler.lost) == 1, what="connection_lost")
            await wait_until(lambda: handler.holding == 0, what="held handlers cancelled")
            assert handler.cancelled == 5
            assert len(server.connections) == 0
            assert handler.lost[0].closed
            with pytest.raises(ClientClosedError):
                await client.request(Frame(ECHO), 1)
        finally:
            for fut in pending:
                fut.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await client.close()
            await server.close()
        assert len(handler.lost) == 1  # exactly once
    run(loop, main)


def test_server_restart_fails_inflight_and_the_client_reconnects(name: str, loop: str) -> None:
    async def main() -> None:
        async with Restartable(name) as r:
            client = r.client
            pending: list[asyncio.Future] = []
            try:
                assert bytes((await client.request(Frame(ECHO, body=b"1"), 5)).body) == b"1"
                pending = [asyncio.ensure_future(client.request(Frame(HOLD), 30)) for _ in range(3)]
                await wait_until(lambda: r.handler.holding == 3, what="3 held requests")
                await r.server.close()
                results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 15)
                assert all(isinstance(x, ConnectionLostError) for x in results), results
                server2 = await r.restart()
                assert server2.address[1] == r.port
                reply = await request_once_reconnected(client, Frame(ECHO, body=b"2"))
                assert bytes(reply.body) == b"2"
                replies = await asyncio.gather(*(client.request(Frame(ECHO, header={"i": i}), 5)
                                                 for i in range(100)))
                assert [x.header["i"] for x in replies] == list(range(100))
            finally:
                for fut in pending:
                    fut.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
    run(loop, main)


def test_request_timeout(name: str, loop: str) -> None:
    async def main() -> None:
        async with serving(name) as (handler, _server, client):
            loop_ = asyncio.get_running_loop()
            started = loop_.time()
            with pytest.raises(RequestTimeoutError):
                await client.request(Frame(SLEEP, header={"seconds": 1.0}), 0.2)
            assert loop_.time() - started < 0.9
            # The late response is dropped and the connection stays usable.
            await asyncio.sleep(1.0)
            assert bytes((await client.request(Frame(ECHO, body=b"z"), 5)).body) == b"z"
    run(loop, main)


def test_connect_to_nothing_is_a_transport_error(name: str, loop: str) -> None:
    async def main() -> None:
        from equeue_core.errors import TransportError
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        port = server.address[1]
        await server.close()
        with pytest.raises(TransportError):
            client = await t.connect(HOST, port, settings(connect_timeout=1.0))
            try:
                await client.request(Frame(ECHO), 1.0)
            finally:
                await client.close()
    run(loop, main)


def test_closing_the_server_closes_its_connections(name: str, loop: str) -> None:
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        clients = [await t.connect(HOST, server.address[1], settings()) for _ in range(3)]
        try:
            for c in clients:
                await c.request(Frame(ECHO), 5)
            assert len(server.connections) == 3
            await server.close()
            assert len(server.connections) == 0
            assert len(handler.lost) == 3
        finally:
            for c in clients:
                await c.close()
    run(loop, main)


def test_pushes_and_responses_interleave_with_encoded_sizes(name: str, loop: str) -> None:
    """Frames of many sizes on one connection, both directions, stay in step."""
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        pushed: list[Frame] = []
        client = await t.connect(HOST, server.address[1], settings(), on_push=pushed.append)
        try:
            sizes = [0, 1, 17, 4095, 4096, 65535, 65536, 200_000, 1_000_003]
            calls = []
            for i, n in enumerate(sizes):
                calls.append(client.request(Frame(ECHO, header={"i": i}, body=bytes([i]) * n), 20))
                calls.append(client.request(Frame(PUSH, header={"count": 3}), 20))
            replies = await asyncio.gather(*calls)
            for i, n in enumerate(sizes):
                assert bytes(replies[2 * i].body) == bytes([i]) * n
            await wait_until(lambda: len(pushed) == 3 * len(sizes), what="pushes")
            assert wire.HEAD_SIZE == 22
        finally:
            await client.close()
            await server.close()
    run(loop, main)


def test_close_leaves_no_sockets_or_threads(name: str, loop: str) -> None:
    """Serve, connect, talk and close five times: open file descriptors and OS threads (ZeroMQ's
    I/O threads included) come back to where they started."""
    def counts() -> tuple[int, int]:
        return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

    async def cycle() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        pushed: list[Frame] = []
        clients = [await t.connect(HOST, server.address[1], settings(), on_push=pushed.append)
                   for _ in range(3)]
        for c in clients:
            await c.request(Frame(PUSH, header={"count": 2}), 5)
            await c.send_oneway(Frame(ECHO))
        for c in clients:
            await c.close()
        await wait_until(lambda: len(handler.lost) == 3, what="3 connections lost")
        await server.close()
        assert len(server.connections) == 0

    async def main() -> None:
        await cycle()  # warm up lazily created loop resources
        before = counts()
        for _ in range(5):
            await cycle()
        await asyncio.sleep(0.05)
        assert counts() == before
    run(loop, main)


def test_close_delivers_what_was_already_sent(name: str, loop: str) -> None:
    """A one-way frame sent right before the client's close() reaches the server, and a handler
    that finishes as the server closes still gets its answer out (TCP guarantees both; ZeroMQ,
    closing with LINGER 0, does its best and must at least fail cleanly)."""
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings())
        client = await t.connect(HOST, server.address[1], settings())
        other = await t.connect(HOST, server.address[1], settings())
        try:
            await client.request(Frame(ECHO), 5)
            await client.send_oneway(Frame(ECHO, header={"last": True}))
            await client.close()
            if name == "tcp":
                await wait_until(lambda: any(f.header.get("last") for f in handler.oneway),
                                 what="the one-way frame sent before close")
            held = asyncio.ensure_future(other.request(Frame(HOLD), 10))
            await wait_until(lambda: handler.holding == 1, what="a held request")
            handler.release.set()  # the handler finishes while the server is closing
            await server.close()
            try:
                reply = await held
                assert reply.header == {"released": True}
            except ConnectionLostError:
                assert name != "tcp", "TCP must deliver a response written before close"
        finally:
            await client.close()
            await other.close()
            await server.close()
    run(loop, main)


# ---------------------------------------------------------------- limits per server

def _refused(reply_or_error: object) -> bool:
    """A refusal reaches the caller as TooManyConnectionsError, raised by the transport (TCP: the
    error frame before the close) or carried by the error response (ZeroMQ)."""
    from equeue_core.client.connection import raise_for_error
    from equeue_core.errors import TooManyConnectionsError

    if isinstance(reply_or_error, TooManyConnectionsError):
        return "limit of 2 connections" in str(reply_or_error)
    if isinstance(reply_or_error, Frame):
        try:
            raise_for_error(reply_or_error)
        except TooManyConnectionsError as e:
            return "limit of 2 connections" in str(e)
    return False


def test_connection_over_the_limit_is_refused_with_a_clear_error_and_the_others_keep_working(
        name: str, loop: str) -> None:
    from equeue_core.errors import TooManyConnectionsError

    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings(max_connections=2))
        clients = [await t.connect(HOST, server.address[1], settings()) for _ in range(3)]
        try:
            for c in clients[:2]:
                assert bytes((await c.request(Frame(ECHO, body=b"in"), 5)).body) == b"in"
            try:
                outcome: object = await clients[2].request(Frame(ECHO, body=b"third"), 5)
            except TooManyConnectionsError as e:
                outcome = e
            assert _refused(outcome), outcome
            assert b"third" not in [bytes(f.body) for f in handler.requests]  # never handled
            for c in clients[:2]:  # the two admitted ones are untouched
                assert bytes((await c.request(Frame(ECHO, body=b"still"), 5)).body) == b"still"
            assert len(server.connections) == 2
        finally:
            for c in clients:
                await c.close()
            await server.close()
    run(loop, main)


def test_idle_connection_is_closed_after_idle_timeout_but_one_with_a_held_request_is_not(
        name: str, loop: str) -> None:
    async def main() -> None:
        t = transport(name)
        handler = ScriptedHandler()
        server = await t.serve(HOST, 0, handler, settings(idle_timeout=0.5))
        idle = await t.connect(HOST, server.address[1], settings())
        busy = await t.connect(HOST, server.address[1], settings())
        try:
            await idle.request(Frame(ECHO), 5)
            idle_ids = set(handler.connections)
            held = asyncio.ensure_future(busy.request(Frame(HOLD), 30))
            await wait_until(lambda: handler.holding == 1, what="the held request")
            busy_ids = set(handler.connections) - idle_ids
            await wait_until(lambda: len(handler.lost) >= 1, timeout=15, what="the idle connection closed")
            await asyncio.sleep(1.5)  # three idle timeouts more: the one with a held request stays
            assert {c.id for c in handler.lost} == idle_ids
            assert busy_ids <= set(server.connections)
            handler.release.set()
            assert (await held).header == {"released": True}
            # the closed client's next request just works (it reconnects)
            assert bytes((await idle.request(Frame(ECHO, body=b"back"), 10)).body) == b"back"
        finally:
            handler.release.set()
            await idle.close()
            await busy.close()
            await server.close()
    run(loop, main)
